#!/usr/bin/env bash
# The secured local stack, no Docker: the local stack as a bank runs it, on ports of its own
# beside the other stacks, with a throwaway certificate authority.
#
#   deploy/local/secure.sh up | down | status
#
#   Kafka       single-node KRaft on localhost:29092, SASL_SSL only (SCRAM-SHA-512); the
#               controller listener (29093) takes mutual TLS; StandardAuthorizer, no access
#               where no ACL allows it; SCRAM users broker, admin, worker and outsider (a
#               worker principal given no ACL, for the refusal tests)
#   PostgreSQL  localhost:25432, ssl=on, hostssl + scram-sha-256 for every login, plaintext
#               and Unix-socket connections rejected; payauth_owner runs the migrations,
#               payauth_app logs in as a member of payauth_worker
#   Redis       localhost:36379, TLS only (client certificates required), ACL users
#               payauth-worker (the fast path's commands only) and payauth-admin; the
#               default user off
#
# Certificates, keys and passwords live in $SECURE_DIR (.stack/secure/, git-ignored), made
# once by `up` (keys and password files mode 0600). `up` writes .stack/secure.env (the
# worker's PAYAUTH_* settings) and .stack/secure-admin.env (the administrator's), never
# printing a password. `down` stops the engines and keeps the data; delete $SECURE_DIR to
# start from scratch.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# stack.sh's functions (apt_install, kafka_fetch, kafka_tool, pg_bindir, wait_for...), and
# its Kafka jars: the secured broker runs the same ones.
STACK_FUNCTIONS_ONLY=1 source "$HERE/stack.sh"

SECURE_DIR=$STACK_DIR/secure
TLS_DIR=$SECURE_DIR/tls
SECURE_KAFKA_PORT=29092
SECURE_KAFKA_CONTROLLER_PORT=29093
SECURE_PG_PORT=25432
SECURE_REDIS_PORT=36379
SECURE_KAFKA_HEAP=${SECURE_KAFKA_HEAP:-512m}
SECURE_PG_DB=payauth
WORKER_ENV=$STACK_DIR/secure.env
ADMIN_ENV=$STACK_DIR/secure-admin.env
PY=${PYTHON:-$ROOT/.venv/bin/python}
# PostgreSQL refuses to run as root: then its data directory belongs to `postgres`, in a
# place that user can reach.
if [ "$(id -u)" = 0 ]; then
  SECURE_PG_DATA=${SECURE_PG_DATA:-/var/lib/postgresql/payauth-secure}
else
  SECURE_PG_DATA=${SECURE_PG_DATA:-$SECURE_DIR/postgres}
fi
SK_DIR=$SECURE_DIR/kafka

step() { printf '[secure] %s\n' "$*"; }
die() { printf '[secure] ERROR: %s\n' "$*" >&2; exit 1; }

# Everything this script writes is its owner's only (keys, passwords, the settings files);
# the certificates are opened up to reading below.
umask 077

# ------------------------------------------------------------------- secrets
secret() { # secret NAME: a random password made once, kept in $SECURE_DIR/secrets (0600)
  local file=$SECURE_DIR/secrets
  [ -f "$file" ] || touch "$file"
  local value; value=$(sed -n "s/^$1=//p" "$file")
  if [ -z "$value" ]; then
    value=$(openssl rand -hex 24)
    printf '%s=%s\n' "$1" "$value" >>"$file"
  fi
  printf '%s' "$value"
}

# -------------------------------------------------------------- certificates
issue() { # issue NAME SUBJECT: a key (PKCS#8, 0600) and a certificate for DNS:localhost
  local name=$1 subject=$2
  [ -f "$TLS_DIR/$name.pem" ] && return 0
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 \
    -out "$TLS_DIR/$name.key" 2>/dev/null
  openssl req -new -key "$TLS_DIR/$name.key" -subj "$subject" \
    -addext "subjectAltName=DNS:localhost" -out "$TLS_DIR/$name.csr" 2>/dev/null
  openssl x509 -req -in "$TLS_DIR/$name.csr" -CA "$TLS_DIR/ca.pem" -CAkey "$TLS_DIR/ca.key" \
    -CAcreateserial -days 30 -copy_extensions copy -out "$TLS_DIR/$name.pem" 2>/dev/null \
    || die "tls: could not sign the $name certificate"
  rm -f "$TLS_DIR/$name.csr"
}

certificates_up() {
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  mkdir -p "$TLS_DIR"
  chmod 700 "$SECURE_DIR"
  if [ ! -f "$TLS_DIR/ca.pem" ]; then
    step "tls: making a throwaway certificate authority"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -noenc -days 30 \
      -subj "/CN=payauth secure stack CA" -keyout "$TLS_DIR/ca.key" -out "$TLS_DIR/ca.pem" \
      2>/dev/null || die "tls: could not make the CA"
  fi
  issue kafka "/CN=kafka-broker"
  issue postgres "/CN=localhost"
  issue redis "/CN=localhost"
  issue client "/CN=payauth"  # Redis asks every client for a certificate
  # Kafka's PEM keystore: the key, then the certificate chain, in one file.
  [ -f "$TLS_DIR/kafka-keystore.pem" ] || sh -c \
    "cat '$TLS_DIR/kafka.key' '$TLS_DIR/kafka.pem' '$TLS_DIR/ca.pem' >'$TLS_DIR/kafka-keystore.pem'"
  chmod 600 "$TLS_DIR"/*.key "$TLS_DIR/kafka-keystore.pem"
  chmod 644 "$TLS_DIR"/*.pem
  chmod 600 "$TLS_DIR/kafka-keystore.pem"
  # The secured directory stays 0700; what the clients read (the CA, the client certificate
  # and its key) must be reachable by the user running them: here, the same user.
  step "tls: CA and certificates ready in $TLS_DIR"
}

# --------------------------------------------------------------------- Kafka
kafka_secure_up() {
  if listening "$SECURE_KAFKA_PORT"; then
    step "kafka: something already listens on $SECURE_KAFKA_PORT, reusing it"; return 0
  fi
  kafka_fetch
  mkdir -p "$SK_DIR/logs"
  # The broker's password through the environment, not a command line others can list.
  BROKER_PASSWORD=$(secret kafka_broker) awk -v data="$SK_DIR/data" -v tls="$TLS_DIR" \
      -v port="$SECURE_KAFKA_PORT" -v cport="$SECURE_KAFKA_CONTROLLER_PORT" \
      '{gsub("@DATA_DIR@", data); gsub("@TLS_DIR@", tls); gsub("@CONTROLLER_PORT@", cport);
        gsub("@PORT@", port); gsub("@BROKER_PASSWORD@", ENVIRON["BROKER_PASSWORD"]); print}' \
      "$HERE/kafka/secure-server.properties" >"$SK_DIR/server.properties.new"
  mv "$SK_DIR/server.properties.new" "$SK_DIR/server.properties"
  if [ ! -f "$SK_DIR/data/meta.properties" ]; then
    step "kafka: formatting KRaft storage with the SCRAM users"
    local id; id=$(kafka_tool kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
    [ -n "$id" ] || die "kafka: could not generate a cluster id"
    local scram=() user
    for user in broker admin worker outsider; do
      scram+=(--add-scram "SCRAM-SHA-512=[name=$user,password=$(secret "kafka_$user")]")
    done
    kafka_tool kafka.tools.StorageTool format -t "$id" -c "$SK_DIR/server.properties" \
      "${scram[@]}" >"$SK_DIR/format.log" 2>&1 \
      || die "kafka: storage format failed, see $SK_DIR/format.log"
  fi
  step "kafka: starting the SASL_SSL broker on localhost:$SECURE_KAFKA_PORT"
  setsid nohup java -Xms"$SECURE_KAFKA_HEAP" -Xmx"$SECURE_KAFKA_HEAP" -XX:+UseG1GC \
    -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
    -Dkafka.logs.dir="$SK_DIR/logs" -cp "$KAFKA_LIBS/*" \
    kafka.Kafka "$SK_DIR/server.properties" >"$SK_DIR/logs/stdout.log" 2>&1 </dev/null &
  echo $! >"$SK_DIR/kafka.pid"
  wait_for kafka 120 listening "$SECURE_KAFKA_PORT" \
    || die "kafka: broker did not open port $SECURE_KAFKA_PORT, see $SK_DIR/logs/"
  step "kafka: ready"
}

kafka_secure_down() {
  if [ -f "$SK_DIR/kafka.pid" ]; then stop_pidfile kafka "$SK_DIR/kafka.pid"
  else step "kafka: not running"; fi
}

# ---------------------------------------------------------------- PostgreSQL
spsql() { # spsql DB ARGS...: as the superuser, over TLS with the server's certificate checked
  local db=$1; shift
  PGPASSWORD=$(secret pg_postgres) PGCONNECT_TIMEOUT=3 psql -X -q \
    "host=localhost port=$SECURE_PG_PORT user=postgres dbname=$db sslmode=verify-full sslrootcert=$TLS_DIR/ca.pem" \
    -v ON_ERROR_STOP=1 "$@"
}

postgres_secure_up() {
  command -v psql >/dev/null 2>&1 || apt_install postgresql-client
  local bin; bin=$(pg_bindir || true)
  if [ -z "$bin" ]; then apt_install postgresql; bin=$(pg_bindir); fi
  if listening "$SECURE_PG_PORT"; then
    step "postgres: something already listens on $SECURE_PG_PORT, reusing it"
  else
    # As root the data directory is one place for every checkout on the machine: a cluster
    # made with another checkout's secrets (its superuser password) would refuse this one's.
    # The hash of the password it was made with says whose it is; another's is made anew.
    local made_with; made_with=$(secret pg_postgres | sha256sum | cut -c1-16)
    if [ -f "$SECURE_PG_DATA/PG_VERSION" ] \
        && [ "$(cat "$SECURE_PG_DATA/payauth-made-with" 2>/dev/null)" != "$made_with" ]; then
      step "postgres: $SECURE_PG_DATA was made with other secrets (another checkout): making it anew"
      rm -rf "$SECURE_PG_DATA"
    fi
    if [ ! -f "$SECURE_PG_DATA/PG_VERSION" ]; then
      step "postgres: initialising a cluster in $SECURE_PG_DATA"
      mkdir -p "$SECURE_PG_DATA"
      local pwfile=$SECURE_PG_DATA.pw
      secret pg_postgres >"$pwfile"
      if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$SECURE_PG_DATA" "$pwfile"; fi
      chmod 700 "$SECURE_PG_DATA"
      "${PG_AS[@]}" "$bin/initdb" -D "$SECURE_PG_DATA" -U postgres --auth=scram-sha-256 \
        --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 >"$SECURE_DIR/postgres-init.log" 2>&1 \
        || { rm -f "$pwfile"; die "postgres: initdb failed, see $SECURE_DIR/postgres-init.log"; }
      rm -f "$pwfile"
      echo "$made_with" >"$SECURE_PG_DATA/payauth-made-with"
    fi
    # The server's key and certificate, the settings and who may connect: written at
    # every start, so a change here reaches an existing cluster.
    install -m 600 "$TLS_DIR/postgres.key" "$SECURE_PG_DATA/server.key"
    install -m 644 "$TLS_DIR/postgres.pem" "$SECURE_PG_DATA/server.crt"
    cat >"$SECURE_PG_DATA/postgresql.auto.conf" <<CONF
listen_addresses = 'localhost'
port = $SECURE_PG_PORT
unix_socket_directories = ''
max_connections = 100
shared_buffers = 128MB
ssl = on
ssl_cert_file = 'server.crt'
ssl_key_file = 'server.key'
ssl_min_protocol_version = 'TLSv1.2'
password_encryption = 'scram-sha-256'
log_connections = on
log_min_messages = warning
CONF
    # TLS and SCRAM for every login; a connection without TLS (or over a Unix socket,
    # which has no line here) is refused by the server before any password is asked.
    cat >"$SECURE_PG_DATA/pg_hba.conf" <<'HBA'
hostssl   all  all  127.0.0.1/32  scram-sha-256
hostssl   all  all  ::1/128       scram-sha-256
hostnossl all  all  all           reject
HBA
    if [ "$(id -u)" = 0 ]; then chown postgres:postgres "$SECURE_PG_DATA"/{server.key,server.crt,postgresql.auto.conf,pg_hba.conf}; fi
    step "postgres: starting on localhost:$SECURE_PG_PORT (TLS only)"
    "${PG_AS[@]}" "$bin/pg_ctl" -D "$SECURE_PG_DATA" -l "$SECURE_PG_DATA/server.log" -w -t 60 start \
      >/dev/null || die "postgres: failed to start, see $SECURE_PG_DATA/server.log"
  fi
  wait_for postgres 60 spsql postgres -c "select 1" \
    || die "postgres: not answering over TLS on localhost:$SECURE_PG_PORT"
  # The owner runs the migrations (and may create the test tier's databases); the worker's
  # login holds nothing but payauth_worker, made here so the owner needs no CREATEROLE.
  # The passwords on psql's standard input, not its command line.
  spsql postgres >/dev/null <<SQL || die "postgres: could not create the roles"
\\set owner_pw '$(secret pg_owner)'
\\set app_pw '$(secret pg_app)'
SELECT format('CREATE ROLE payauth_owner LOGIN CREATEDB PASSWORD %L', :'owner_pw')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'payauth_owner') \gexec
SELECT format('ALTER ROLE payauth_owner PASSWORD %L', :'owner_pw') \gexec
SELECT 'CREATE ROLE payauth_worker NOLOGIN'
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'payauth_worker') \gexec
SELECT format('CREATE ROLE payauth_app LOGIN PASSWORD %L IN ROLE payauth_worker', :'app_pw')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'payauth_app') \gexec
SELECT format('ALTER ROLE payauth_app PASSWORD %L', :'app_pw') \gexec
SQL
  spsql postgres -tAc "select 1 from pg_database where datname = '$SECURE_PG_DB'" | grep -q 1 \
    || spsql postgres -c "create database $SECURE_PG_DB owner payauth_owner $PG_DB_OPTIONS" \
      >/dev/null \
    || die "postgres: could not create database $SECURE_PG_DB"
  step "postgres: ready (database $SECURE_PG_DB, logins payauth_owner and payauth_app)"
}

postgres_secure_down() {
  local bin; bin=$(pg_bindir || true)
  if [ -n "$bin" ] && [ -f "$SECURE_PG_DATA/postmaster.pid" ]; then
    step "postgres: stopping"
    "${PG_AS[@]}" "$bin/pg_ctl" -D "$SECURE_PG_DATA" -m fast -w stop >/dev/null || true
  else
    step "postgres: not running"
  fi
}

# --------------------------------------------------------------------- Redis
sredis() { # sredis ARGS...: redis-cli as payauth-admin, over TLS
  REDISCLI_AUTH=$(secret redis_admin) redis-cli --tls --cacert "$TLS_DIR/ca.pem" \
    --cert "$TLS_DIR/client.pem" --key "$TLS_DIR/client.key" -h localhost \
    -p "$SECURE_REDIS_PORT" --user payauth-admin "$@"
}

redis_secure_up() {
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server
  if listening "$SECURE_REDIS_PORT"; then
    step "redis: something already listens on $SECURE_REDIS_PORT, reusing it"
  else
    mkdir -p "$SECURE_DIR/redis"
    local worker_hash admin_hash
    worker_hash=$(printf '%s' "$(secret redis_worker)" | sha256sum | cut -d' ' -f1)
    admin_hash=$(printf '%s' "$(secret redis_admin)" | sha256sum | cut -d' ' -f1)
    # The worker's user: the fast path's commands (service/adapters/redis_cache.py: HSET and
    # EXPIREAT to write, its lookup script by EVALSHA with HMGET inside, SCRIPT LOAD when
    # the server lost the script, PING for health), on its own keys only.
    tee "$SECURE_DIR/redis/redis.conf" >/dev/null <<CONF
bind 127.0.0.1
port 0
tls-port $SECURE_REDIS_PORT
tls-cert-file $TLS_DIR/redis.pem
tls-key-file $TLS_DIR/redis.key
tls-ca-cert-file $TLS_DIR/ca.pem
tls-auth-clients yes
daemonize yes
dir $SECURE_DIR/redis
pidfile $SECURE_DIR/redis/redis.pid
logfile $SECURE_DIR/redis/redis.log
save ""
appendonly no
user default off
user payauth-worker on #$worker_hash resetkeys ~dedup:* resetchannels -@all +ping +hset +hmget +expireat +evalsha +script|load
user payauth-admin on #$admin_hash ~* &* +@all
CONF
    step "redis: starting on localhost:$SECURE_REDIS_PORT (TLS only)"
    redis-server "$SECURE_DIR/redis/redis.conf" >/dev/null \
      || die "redis: failed to start, see $SECURE_DIR/redis/redis.log"
  fi
  wait_for redis 30 sredis ping || die "redis: not answering over TLS on localhost:$SECURE_REDIS_PORT"
  step "redis: ready (users payauth-worker, payauth-admin)"
}

redis_secure_down() {
  if [ -f "$SECURE_DIR/redis/redis.pid" ]; then
    step "redis: stopping"
    sredis shutdown nosave >/dev/null 2>&1 || stop_pidfile redis "$SECURE_DIR/redis/redis.pid"
    rm -f "$SECURE_DIR/redis/redis.pid"
  else
    step "redis: not running"
  fi
}

# ---------------------------------------------------------- the settings files
write_env() { # write_env FILE KAFKA_USER PG_USER REDIS_USER
  local file=$1 ca=$TLS_DIR/ca.pem
  tee "$file" >/dev/null <<ENV
PAYAUTH_KAFKA_BOOTSTRAP_SERVERS=localhost:$SECURE_KAFKA_PORT
PAYAUTH_KAFKA_SECURITY_PROTOCOL=SASL_SSL
PAYAUTH_KAFKA_SASL_MECHANISM=SCRAM-SHA-512
PAYAUTH_KAFKA_SASL_USERNAME=$2
PAYAUTH_KAFKA_SASL_PASSWORD=$(secret "kafka_$2")
PAYAUTH_KAFKA_SSL_CA_LOCATION=$ca
PAYAUTH_DATABASE_URL=postgresql://$3:$(secret "pg_${3#payauth_}")@localhost:$SECURE_PG_PORT/$SECURE_PG_DB?sslmode=verify-full&sslrootcert=$ca
PAYAUTH_REDIS_URL=rediss://$4:$(secret "redis_${4#payauth-}")@localhost:$SECURE_REDIS_PORT/0?ssl_ca_certs=$ca&ssl_certfile=$TLS_DIR/client.pem&ssl_keyfile=$TLS_DIR/client.key
ENV
}

settings_up() {
  write_env "$WORKER_ENV" worker payauth_app payauth-worker
  write_env "$ADMIN_ENV" admin payauth_owner payauth-admin
  step "settings: $WORKER_ENV (worker) and $ADMIN_ENV (administrator), mode 0600"
}

app_up() { # migrations and topics as the administrator, then the worker's ACLs
  local admin=() line
  while IFS= read -r line; do admin+=("$line"); done <"$ADMIN_ENV"
  step "postgres: migrating as payauth_owner"
  env "${admin[@]}" PAYAUTH_LOG_LEVEL=WARNING "$PY" -m service migrate >/dev/null \
    || die "postgres: payauth migrate failed"
  step "kafka: ensuring topics as admin"
  env "${admin[@]}" PAYAUTH_LOG_LEVEL=WARNING "$PY" -m service topics --partitions "$INPUT_PARTITIONS" \
    --wait 120 >/dev/null || die "kafka: could not create the topics"
  step "kafka: the worker's ACLs (payauth acls --principal User:worker --execute)"
  env "${admin[@]}" PAYAUTH_LOG_LEVEL=WARNING "$PY" -m service acls --principal User:worker \
    --execute >/dev/null || die "kafka: could not create the worker's ACLs"
}

status() {
  local p
  for p in "$SECURE_PG_PORT:postgres" "$SECURE_REDIS_PORT:redis" "$SECURE_KAFKA_PORT:kafka"; do
    if listening "${p%%:*}"; then echo "${p#*:}: up (${p%%:*})"; else echo "${p#*:}: down (${p%%:*})"; fi
  done
}

mkdir -p "$SECURE_DIR"
case "${1:-}" in
  up) certificates_up; postgres_secure_up; redis_secure_up; kafka_secure_up; settings_up; app_up
      step "secured stack is up" ;;
  down) kafka_secure_down; redis_secure_down; postgres_secure_down; step "secured stack is down" ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
