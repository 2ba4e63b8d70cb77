#!/usr/bin/env bash
# The local stack without Docker: Apache Kafka (single-node KRaft, jars from Maven Central),
# PostgreSQL and Redis (Debian packages). Idempotent: whatever already answers on its port is
# reused and left alone. One line per step; a failing step stops with a clear message.
#
#   deploy/local/stack.sh up | down | status | tools | restart-postgres | restart-redis | restart-kafka
#
# State lives in $STACK_DIR (default .stack/ at the repository root, git-ignored). PostgreSQL
# refuses to run as root, so when we are root its data directory belongs to the `postgres`
# user in a directory that user can reach ($PG_DATA).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
STACK_DIR=${STACK_DIR:-$ROOT/.stack}
KAFKA_PORT=${KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-9093}
PG_PORT=${PG_PORT:-5432}
REDIS_PORT=${REDIS_PORT:-6379}
PG_DB=${PG_DB:-payauth}
INPUT_PARTITIONS=${INPUT_PARTITIONS:-12}
KAFKA_HEAP=${KAFKA_HEAP:-768m}

if [ "$(id -u)" = 0 ]; then
  PG_DATA=${PG_DATA:-/var/lib/postgresql/payauth-stack}
  PG_AS=(runuser -u postgres -- env -C /)  # -C /: the caller's directory may be private
else
  PG_DATA=${PG_DATA:-$STACK_DIR/postgres}
  PG_AS=()
fi

step() { printf '[stack] %s\n' "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() { # wait_for NAME SECONDS COMMAND...
  local name=$1 seconds=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
}

apt_install() { # apt_install PACKAGE... (only when we may)
  if [ "$(id -u)" != 0 ]; then
    die "missing $*; install it (e.g. sudo apt-get install -y $*) and run again"
  fi
  step "installing $* from Debian packages"
  if [ ! -f "$STACK_DIR/.apt-updated" ]; then
    apt-get update -qq >"$STACK_DIR/apt.log" 2>&1 || die "apt-get update failed, see $STACK_DIR/apt.log"
    touch "$STACK_DIR/.apt-updated"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >>"$STACK_DIR/apt.log" 2>&1 \
    || die "apt-get install $* failed, see $STACK_DIR/apt.log"
}

pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$d" ] && [ -x "$d/postgres" ] && { echo "$d"; return; }
  command -v pg_ctl >/dev/null 2>&1 && dirname "$(readlink -f "$(command -v pg_ctl)")"
}

# ---------------------------------------------------------------- PostgreSQL
postgres_up() {
  command -v psql >/dev/null 2>&1 || apt_install postgresql-client
  if listening "$PG_PORT"; then
    step "postgres: something already listens on $PG_PORT, reusing it"
  else
    local bin; bin=$(pg_bindir || true)
    if [ -z "$bin" ]; then apt_install postgresql; bin=$(pg_bindir); fi
    [ -n "$bin" ] || die "postgres: no PostgreSQL server binaries found after install"
    if [ ! -f "$PG_DATA/PG_VERSION" ]; then
      step "postgres: initialising a cluster in $PG_DATA"
      mkdir -p "$PG_DATA"
      [ "$(id -u)" = 0 ] && chown postgres:postgres "$PG_DATA" && chmod 700 "$PG_DATA"
      "${PG_AS[@]}" "$bin/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 \
        >"$STACK_DIR/postgres-init.log" 2>&1 || die "postgres: initdb failed, see $STACK_DIR/postgres-init.log"
      # A development stack on loopback only: trust local connections so the contract's
      # default URL (postgresql://localhost:5432/payauth, no password) works as-is.
      cat >"$PG_DATA/postgresql.auto.conf" <<CONF
listen_addresses = 'localhost'
port = $PG_PORT
unix_socket_directories = '/tmp'
max_connections = 200
shared_buffers = 256MB
synchronous_commit = on
log_min_messages = warning
CONF
      [ "$(id -u)" = 0 ] && chown postgres:postgres "$PG_DATA/postgresql.auto.conf"
    fi
    step "postgres: starting on localhost:$PG_PORT"
    local log=$PG_DATA/server.log
    "${PG_AS[@]}" "$bin/pg_ctl" -D "$PG_DATA" -l "$log" -w -t 60 start >/dev/null \
      || die "postgres: failed to start, see $log"
  fi
  wait_for postgres 60 psql_cmd postgres -c "select 1" || die "postgres: not answering on localhost:$PG_PORT"
  ensure_role_and_db
  step "postgres: ready (database $PG_DB)"
}

psql_cmd() { # psql_cmd DB ARGS...
  local db=$1; shift
  PGCONNECT_TIMEOUT=3 psql -X -q -h localhost -p "$PG_PORT" -U "${PGUSER:-postgres}" -d "$db" -v ON_ERROR_STOP=1 "$@"
}

# payauth's database compares text byte by byte ("C"), whatever the cluster's locale
# (docs/operations.md, "The database's collation"); service/ops/migrate.py CREATE_OPTIONS.
PG_DB_OPTIONS="template template0 lc_collate 'C'"

ensure_role_and_db() {
  local me; me=$(id -un)
  if [ "$me" != postgres ]; then
    psql_cmd postgres -tAc "select 1 from pg_roles where rolname = '$me'" | grep -q 1 \
      || psql_cmd postgres -c "create role \"$me\" login superuser" >/dev/null \
      || die "postgres: could not create role $me"
  fi
  psql_cmd postgres -tAc "select 1 from pg_database where datname = '$PG_DB'" | grep -q 1 \
    || psql_cmd postgres -c "create database \"$PG_DB\" owner \"$me\" $PG_DB_OPTIONS" >/dev/null \
    || die "postgres: could not create database $PG_DB"
}

postgres_down() {
  local bin; bin=$(pg_bindir || true)
  if [ -n "$bin" ] && [ -f "$PG_DATA/postmaster.pid" ]; then
    step "postgres: stopping"
    "${PG_AS[@]}" "$bin/pg_ctl" -D "$PG_DATA" -m fast -w stop >/dev/null || true
  else
    step "postgres: not ours or not running, left alone"
  fi
}

postgres_restart() {
  local bin; bin=$(pg_bindir)
  step "postgres: restarting"
  "${PG_AS[@]}" "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -m fast -w restart >/dev/null
}

# --------------------------------------------------------------------- Redis
redis_up() {
  if listening "$REDIS_PORT"; then
    step "redis: something already listens on $REDIS_PORT, reusing it"
  else
    command -v redis-server >/dev/null 2>&1 || apt_install redis-server
    step "redis: starting on localhost:$REDIS_PORT"
    mkdir -p "$STACK_DIR/redis"
    redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --daemonize yes \
      --dir "$STACK_DIR/redis" --pidfile "$STACK_DIR/redis/redis.pid" \
      --logfile "$STACK_DIR/redis/redis.log" --save '' --appendonly no >/dev/null \
      || die "redis: failed to start, see $STACK_DIR/redis/redis.log"
  fi
  wait_for redis 30 redis-cli -p "$REDIS_PORT" ping || die "redis: not answering on localhost:$REDIS_PORT"
  step "redis: ready"
}

redis_down() {
  if [ -f "$STACK_DIR/redis/redis.pid" ]; then
    step "redis: stopping"
    redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    rm -f "$STACK_DIR/redis/redis.pid"
  else
    step "redis: not ours or not running, left alone"
  fi
}

# --------------------------------------------------------------------- Kafka
KAFKA_DIR=$STACK_DIR/kafka
KAFKA_LIBS=$KAFKA_DIR/libs

kafka_fetch() {
  if [ -f "$KAFKA_LIBS/.complete" ]; then return; fi
  command -v java >/dev/null 2>&1 || apt_install default-jre-headless
  command -v mvn >/dev/null 2>&1 || apt_install maven
  step "kafka: fetching broker jars from Maven Central (first run only)"
  mkdir -p "$KAFKA_LIBS"
  (cd "$ROOT/deploy/local/kafka" && mvn -q -B dependency:copy-dependencies \
      -DoutputDirectory="$KAFKA_LIBS" -DincludeScope=runtime) >"$KAFKA_DIR/mvn.log" 2>&1 \
    || die "kafka: mvn dependency:copy-dependencies failed, see $KAFKA_DIR/mvn.log"
  touch "$KAFKA_LIBS/.complete"
}

kafka_tool() { # the broker's own command-line tools, same class path
  java -Xmx256m -Dlog4j2.configurationFile="$ROOT/deploy/local/kafka/log4j2.properties" \
    -Dkafka.logs.dir="$KAFKA_DIR/logs" -cp "$KAFKA_LIBS/*" "$@"
}

kafka_up() {
  if listening "$KAFKA_PORT"; then
    step "kafka: something already listens on $KAFKA_PORT, reusing it"
  else
    kafka_fetch
    mkdir -p "$KAFKA_DIR/logs"
    sed -e "s#@DATA_DIR@#$KAFKA_DIR/data#" -e "s#@PORT@#$KAFKA_PORT#g" \
        -e "s#@CONTROLLER_PORT@#$KAFKA_CONTROLLER_PORT#g" \
        "$ROOT/deploy/local/kafka/server.properties" >"$KAFKA_DIR/server.properties"
    if [ ! -f "$KAFKA_DIR/data/meta.properties" ]; then
      step "kafka: formatting KRaft storage"
      local id; id=$(kafka_tool kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
      [ -n "$id" ] || die "kafka: could not generate a cluster id"
      kafka_tool kafka.tools.StorageTool format -t "$id" -c "$KAFKA_DIR/server.properties" \
        >"$KAFKA_DIR/format.log" 2>&1 || die "kafka: storage format failed, see $KAFKA_DIR/format.log"
    fi
    step "kafka: starting single-node KRaft broker on localhost:$KAFKA_PORT"
    # setsid + nohup: the broker outlives this script and a Ctrl-C in the calling terminal.
    setsid nohup java -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" -XX:+UseG1GC \
      -Dlog4j2.configurationFile="$ROOT/deploy/local/kafka/log4j2.properties" \
      -Dkafka.logs.dir="$KAFKA_DIR/logs" -cp "$KAFKA_LIBS/*" \
      kafka.Kafka "$KAFKA_DIR/server.properties" >"$KAFKA_DIR/logs/stdout.log" 2>&1 </dev/null &
    echo $! >"$KAFKA_DIR/kafka.pid"
  fi
  wait_for kafka 120 listening "$KAFKA_PORT" || die "kafka: broker did not open port $KAFKA_PORT, see $KAFKA_DIR/logs/"
  step "kafka: ready"
}

stop_pidfile() { # stop_pidfile NAME PIDFILE: SIGTERM, 30 s to go, then SIGKILL
  local pid; pid=$(cat "$2")
  step "$1: stopping (pid $pid)"
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$2"
}

kafka_down() {
  if [ -f "$KAFKA_DIR/kafka.pid" ]; then
    stop_pidfile kafka "$KAFKA_DIR/kafka.pid"
  else
    step "kafka: not ours or not running, left alone"
  fi
}

topics_up() {
  local py=${PYTHON:-$ROOT/.venv/bin/python}
  step "kafka: ensuring topics (input with $INPUT_PARTITIONS partitions, output, dead-letter)"
  "$py" -m service topics --partitions "$INPUT_PARTITIONS" --wait 120 \
    || die "kafka: could not create the topics"
}

mkdir -p "$STACK_DIR"
# Sourced by ha.sh for these functions only.
if [ "${STACK_FUNCTIONS_ONLY:-}" = 1 ]; then return 0; fi
case "${1:-}" in
  up) postgres_up; redis_up; kafka_up; topics_up; step "stack is up" ;;
  down) kafka_down; redis_down; postgres_down; step "stack is down" ;;
  tools)  # what the tests call besides the stack: promtool checks the alert rules; valgrind
          # counts the server's instructions (bench.instructions); as root, nft makes the
          # partition faults in the namespaces of the netsplit tests
    command -v promtool >/dev/null 2>&1 || apt_install prometheus
    command -v valgrind >/dev/null 2>&1 || apt_install valgrind
    if [ "$(id -u)" = 0 ]; then
      command -v nft >/dev/null 2>&1 || apt_install nftables
      step "test tools ready (promtool, valgrind, nft)"
    else
      step "test tools ready (promtool, valgrind; not root: no nft, the netsplit tests skip)"
    fi ;;
  restart-postgres) postgres_restart ;;
  restart-redis) redis_down; redis_up ;;
  restart-kafka) kafka_down; kafka_up ;;
  status)
    for p in "$PG_PORT:postgres" "$REDIS_PORT:redis" "$KAFKA_PORT:kafka"; do
      if listening "${p%%:*}"; then echo "${p#*:}: up (${p%%:*})"; else echo "${p#*:}: down (${p%%:*})"; fi
    done ;;
  *) echo "usage: $0 up|down|status|tools|restart-postgres|restart-redis|restart-kafka" >&2; exit 2 ;;
esac
