#!/usr/bin/env bash
# The local replicated stack, no Docker: each service a real process, as root each node in a
# network namespace of its own (ha_net.sh: addresses $HA_NET.x on a bridge; otherwise all on
# the loopback).
#   deploy/local/ha.sh up | down | wipe | status
#
#   Kafka       three combined KRaft nodes (ports 19092-19094, controllers 19192-19194,
#               a second listener for proxied clients on 19292-19294 advertising the
#               proxies' 19392-19394), replication factor 3, min.insync.replicas 2, unclean
#               leader election off; heap $HA_KAFKA_HEAP (512m) each
#   PostgreSQL  pg_auto_failover (Debian postgresql-15-auto-failover): a monitor (15432), a
#               primary and two secondaries (15433-15435), a commit acknowledged once one of
#               them has it (number_sync_standbys 1), automatic failover
#   Redis       a master (16379), a replica (16380) and three Sentinels (26379-26381)
#
# Its ports differ from the single-node stack's (stack.sh): both can run at once. `up`
# writes the PAYAUTH_* lines a worker needs to $STACK_DIR/ha.env and prints them.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STACK_FUNCTIONS_ONLY=1 source "$HERE/stack.sh"
source "$HERE/ha_net.sh"

HA_DIR=$STACK_DIR/ha
HA_KAFKA_HEAP=${HA_KAFKA_HEAP:-512m}
KAFKA_PORTS=(19092 19093 19094)
KAFKA_CONTROLLER_PORTS=(19192 19193 19194)
# A second listener per node for clients that go through a TCP proxy (the HA chaos run cuts
# one broker from the workers that way): it listens on 19292-19294 and advertises
# 19392-19394 on the host's side of the bridge (bridge_addr), where the proxies listen.
# Nothing else uses it.
KAFKA_PROXIED_PORTS=(19292 19293 19294)
KAFKA_PROXY_PORTS=(19392 19393 19394)
PG_MONITOR_PORT=15432
PG_NODE_PORTS=(15433 15434 15435)
REDIS_MASTER_PORT=16379
REDIS_REPLICA_PORT=16380
SENTINEL_PORTS=(26379 26380 26381)
SENTINEL_MASTER=payauth
# PostgreSQL refuses to run as root: as root, its directories belong to `postgres`.
if [ "$(id -u)" = 0 ]; then
  PG_HA_DIR=${PG_HA_DIR:-/var/lib/postgresql/payauth-ha}
else
  PG_HA_DIR=${PG_HA_DIR:-$HA_DIR/postgres}
fi
# The keepers' connection to the monitor gives up within about 5 s of a silent network
# (nothing sent acknowledged, no keepalive answered): a primary cut off while its keeper
# waited on the monitor was seen to sit blocked for the whole cut (40 s), its server taking
# the workers' batches all along; once the call fails, the keeper's
# network_partition_timeout stops its server (docs/high-availability.md, "Partitions").
MONITOR_URI="postgres://autoctl_node@$(node_addr pgm):$PG_MONITOR_PORT/pg_auto_failover"
MONITOR_URI+="?sslmode=disable&tcp_user_timeout=5000"
MONITOR_URI+="&keepalives_idle=2&keepalives_interval=1&keepalives_count=3"

step() { printf '[ha] %s\n' "$*"; }
die() { printf '[ha] ERROR: %s\n' "$*" >&2; exit 1; }

autoctl() { "${PG_AS[@]}" env PATH="$(pg_bindir):$PATH" pg_autoctl "$@"; }
background() { # background LOG COMMAND...: outlives this script and a Ctrl-C
  local log=$1; shift
  setsid nohup "$@" >"$log" 2>&1 </dev/null &
}
# The command prefix that runs a program inside NODE's namespace (none on the loopback).
node_exec() { if ha_netns; then echo "ip netns exec $HA_NS_PREFIX$1"; fi; }

# -------------------------------------------------------------------- Kafka
kafka_node_dir() { echo "$HA_DIR/kafka-$1"; }

kafka_voters() {
  local voters="" i
  for i in 0 1 2; do
    voters+="${voters:+,}$((i + 1))@$(node_addr "k$((i + 1))"):${KAFKA_CONTROLLER_PORTS[$i]}"
  done
  echo "$voters"
}

kafka_cluster_id() { # one id for the three nodes, made once
  local cluster_id=""
  [ -f "$HA_DIR/kafka-cluster-id" ] && cluster_id=$(cat "$HA_DIR/kafka-cluster-id")
  if [ -z "$cluster_id" ]; then
    cluster_id=$(kafka_tool kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)
    [ -n "$cluster_id" ] || die "kafka: could not generate a cluster id"
    echo "$cluster_id" >"$HA_DIR/kafka-cluster-id"
  fi
  echo "$cluster_id"
}

kafka_node_up() { # kafka_node_up NODE (1-3): start it unless it listens; no wait
  local node=$1 i=$(($1 - 1)) dir; dir=$(kafka_node_dir "$node")
  if node_listening "k$node" "${KAFKA_PORTS[$i]}"; then
    step "kafka: node $node already listens on ${KAFKA_PORTS[$i]}"; return 0
  fi
  mkdir -p "$dir/logs"
  sed -e "s#@DATA_DIR@#$dir/data#" -e "s#@PORT@#${KAFKA_PORTS[$i]}#g" \
      -e "s#@ADDRESS@#$(node_addr "k$node")#g" \
      -e "s#@CONTROLLER_PORT@#${KAFKA_CONTROLLER_PORTS[$i]}#g" -e "s#@NODE_ID@#$node#" \
      -e "s#@PROXIED_PORT@#${KAFKA_PROXIED_PORTS[$i]}#g" \
      -e "s#@PROXY_PORT@#${KAFKA_PROXY_PORTS[$i]}#g" -e "s#@PROXY_HOST@#$(bridge_addr)#g" \
      -e "s#@VOTERS@#$(kafka_voters)#" "$HERE/kafka/ha-server.properties" >"$dir/server.properties"
  if [ ! -f "$dir/data/meta.properties" ]; then
    kafka_tool kafka.tools.StorageTool format -t "$(kafka_cluster_id)" -c "$dir/server.properties" \
      >"$dir/format.log" 2>&1 || die "kafka: formatting node $node failed, see $dir/format.log"
  fi
  step "kafka: starting node $node on $(node_addr "k$node"):${KAFKA_PORTS[$i]}"
  # shellcheck disable=SC2046  # the namespace's prefix: words
  background "$dir/logs/stdout.log" $(node_exec "k$node") java -Xms"$HA_KAFKA_HEAP" -Xmx"$HA_KAFKA_HEAP" \
    -XX:+UseG1GC -Dlog4j2.configurationFile="$ROOT/deploy/local/kafka/log4j2.properties" \
    -Dkafka.logs.dir="$dir/logs" -cp "$KAFKA_LIBS/*" kafka.Kafka "$dir/server.properties"
  echo $! >"$dir/kafka.pid"
}

kafka_node_wait() { # kafka_node_wait NODE
  # 240 s: a node restarted on 2 cores shared with test suites (load average near 30) was
  # seen to take 123 s to open its port (its controller's replay alone took 20 s).
  wait_for "kafka node $1" 240 node_listening "k$1" "${KAFKA_PORTS[$(($1 - 1))]}" \
    || die "kafka: node $1 did not open ${KAFKA_PORTS[$(($1 - 1))]}, see $(kafka_node_dir "$1")/logs/"
}

kafka_ha_up() {
  kafka_fetch
  local node
  for node in 1 2 3; do kafka_node_up "$node"; done
  for node in 1 2 3; do kafka_node_wait "$node"; done
  step "kafka: three nodes ready"
}

kafka_ha_down() {
  local node dir
  for node in 1 2 3; do
    dir=$(kafka_node_dir "$node")
    # (An if, not `[ -f ] && …`: a node without a pid file would make the function fail,
    # and `set -e` end `down` before Redis and PostgreSQL are stopped.)
    if [ -f "$dir/kafka.pid" ]; then
      stop_pidfile "kafka node $node" "$dir/kafka.pid"
    fi
  done
}

# --------------------------------------------------------------- PostgreSQL
pg_ha_up() {
  command -v psql >/dev/null 2>&1 || apt_install postgresql-client
  [ -n "$(pg_bindir || true)" ] || apt_install postgresql
  command -v pg_autoctl >/dev/null 2>&1 \
    || apt_install "postgresql-$(basename "$(dirname "$(pg_bindir)")")-auto-failover" pg-auto-failover-cli
  mkdir -p "$PG_HA_DIR"
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$PG_HA_DIR"
  if ! node_listening pgm "$PG_MONITOR_PORT"; then
    if [ ! -f "$PG_HA_DIR/monitor/PG_VERSION" ]; then
      pg_forget_keeper "$PG_HA_DIR/monitor"
      step "postgres: creating the pg_auto_failover monitor"
      # shellcheck disable=SC2046  # the namespace's prefix: words
      $(node_exec pgm) "${PG_AS[@]}" env PATH="$(pg_bindir):$PATH" pg_autoctl create monitor \
        --pgdata "$PG_HA_DIR/monitor" --pgport "$PG_MONITOR_PORT" \
        --hostname "$(node_addr pgm)" --auth trust --no-ssl >"$HA_DIR/pg-monitor-create.log" 2>&1 \
        || die "postgres: monitor creation failed, see $HA_DIR/pg-monitor-create.log"
      pg_trust_the_stack "$PG_HA_DIR/monitor"
    fi
    step "postgres: starting the monitor on $(node_addr pgm):$PG_MONITOR_PORT"
    # shellcheck disable=SC2046
    background "$HA_DIR/pg-monitor.log" $(node_exec pgm) "${PG_AS[@]}" \
      env PATH="$(pg_bindir):$PATH" pg_autoctl run --pgdata "$PG_HA_DIR/monitor"
    wait_for monitor 60 node_listening pgm "$PG_MONITOR_PORT" \
      || die "postgres: monitor not up, see $HA_DIR/pg-monitor.log"
  fi
  # Listening is not accepting: a monitor restarted from its data answers "the database
  # system is starting up" until its recovery ends.
  wait_for "the monitor's database" 60 pg_monitor_accepts \
    || die "postgres: the monitor accepts no connection, see $HA_DIR/pg-monitor.log"
  pg_monitor_settings
  local node
  # A cluster stopped whole comes back whole: its monitor asks every node for its LSN
  # (report_lsn) before it names a primary, so the nodes that exist start together, then
  # each settles; a new node is created after the ones before it (the first: the primary).
  for node in 1 2 3; do
    [ ! -f "$PG_HA_DIR/node$node/PG_VERSION" ] || pg_node_start "$node"
  done
  for node in 1 2 3; do pg_node_up "$node"; done
  pg_number_sync_standbys
  # The monitor names both secondaries once they have caught up.
  wait_for "synchronous replication" 60 pg_sync_on \
    || die "postgres: the primary has not both standbys in its quorum, see $HA_DIR/pg-node*.log"
  step "postgres: a primary and two secondaries, a commit waits for one ($(pg_sync_names))"
}

# Why three data nodes, one of two standbys acknowledging each commit (docs/failover.md):
# with a single standby, pg_auto_failover 2.0 lets the primary take writes alone whenever
# that standby is not a healthy secondary, for a moment in every switchover (its issue
# #774) and until a killed primary's successor has a standby again. With two, the one
# not being promoted or rebuilt keeps the second copy (all but the second after a
# promotion, until a standby follows the new primary); and with number_sync_standbys 1
# (not 0) a primary whose two standbys are both gone makes its commits wait rather than
# acknowledge them from one copy. The monitor sets 1 by itself when the second standby
# joins; it is checked here and set if a formation made otherwise lacks it.
PG_NUMBER_SYNC_STANDBYS=1

monitor_psql() { # monitor_psql PSQL-ARGS...: psql as postgres on the monitor's database
  psql -X -h "$(node_addr pgm)" -p "$PG_MONITOR_PORT" -U postgres -d pg_auto_failover "$@"
}

node_psql() { # node_psql NODE (1-3) PSQL-ARGS...: psql as postgres on a data node
  psql -X -h "$(node_addr "pg$1")" -p "${PG_NODE_PORTS[$(($1 - 1))]}" -U postgres -d postgres \
    "${@:2}"
}

pg_formation_sync_standbys() {
  monitor_psql -tAc \
    "SELECT number_sync_standbys FROM pgautofailover.formation WHERE formationid = 'default'"
}

pg_number_sync_standbys() {
  [ "$(pg_formation_sync_standbys)" = "$PG_NUMBER_SYNC_STANDBYS" ] && return 0
  # --monitor, not --pgdata: pg_autoctl 2.0 misreads the value given with --pgdata
  autoctl set formation number-sync-standbys --monitor "$MONITOR_URI" \
    "$PG_NUMBER_SYNC_STANDBYS" >/dev/null 2>&1 \
    || die "postgres: could not set number_sync_standbys $PG_NUMBER_SYNC_STANDBYS"
  [ "$(pg_formation_sync_standbys)" = "$PG_NUMBER_SYNC_STANDBYS" ] \
    || die "postgres: number_sync_standbys is not $PG_NUMBER_SYNC_STANDBYS on the monitor"
}

# Failover within seconds (docs/failover.md). The monitor promotes a secondary once the
# primary both fails its health checks and has not reported for
# node_considered_unhealthy_timeout: a check each second, a failed one retried twice 500 ms
# apart (a connection that takes 2 s is a failure), and 2 s of silence, instead of 5 s, 2 s
# and 20 s. The new primary then takes writes once the old one is demoted or
# primary_demote_timeout has passed: 10 s instead of 30, what a primary that never reports
# again (a host dead for good, a partition) costs. It outlasts the keepers'
# network_partition_timeout (3 s, see pg_keeper_settings), after which a primary that can
# reach neither the monitor nor its standbys stops taking writes by itself, and a one-way
# cut's 8 s (tcp_user_timeout below, then those 3 s). A primary slower than that to stop
# still acknowledges nothing: no standby receives from it (docs/failover.md). It did not
# protect a switchover with one standby from pg_auto_failover 2.0's race (#774), whatever
# its length; the third node above does.
PG_MONITOR_SETTINGS=(
  "pgautofailover.health_check_period=1000"
  "pgautofailover.health_check_timeout=2000"
  "pgautofailover.health_check_max_retries=2"
  "pgautofailover.health_check_retry_delay=500"
  "pgautofailover.node_considered_unhealthy_timeout=2000"
  "pgautofailover.primary_demote_timeout=10000"
)
PG_KEEPER_NETWORK_PARTITION_TIMEOUT=3
# A primary cut off one way (what it sends is lost, what it receives arrives) still has its
# standbys' replies, so its WAL senders stay connected and its keeper does not count itself
# partitioned until a sender gives up: wal_sender_timeout (60 s) never fires, the replies
# arriving. tcp_user_timeout ends a connection whose sent data stays unacknowledged for 5 s,
# and the keeper's own timeout follows (docs/high-availability.md, "Partitions").
PG_NODE_SETTINGS=("tcp_user_timeout=5000")

pg_monitor_accepts() {
  monitor_psql -q -c "SELECT 1" >/dev/null 2>&1
}

pg_monitor_settings() { # the GUCs above on the monitor (ALTER SYSTEM: they survive restarts)
  local setting
  for setting in "${PG_MONITOR_SETTINGS[@]}"; do
    monitor_psql -q -c "ALTER SYSTEM SET ${setting%%=*} = '${setting#*=}'" >/dev/null \
      || die "postgres: could not set ${setting%%=*} on the monitor"
  done
  monitor_psql -q -c "SELECT pg_reload_conf()" >/dev/null \
    || die "postgres: the monitor did not reload"
}

keeper_config_set() { # keeper_config_set PGDATA KEY VALUE: set, and read back
  # `config set` writes the value, then signals the keeper its pid file names to reload;
  # that signal was seen to hang the command up on itself ("Hangup") once the value was
  # written: the value read back decides, tried up to five times.
  local attempt
  for attempt in 1 2 3 4 5; do
    [ "$(autoctl config get --pgdata "$1" "$2" 2>/dev/null)" = "$3" ] && return 0
    autoctl config set --pgdata "$1" "$2" "$3" >/dev/null 2>&1 || sleep 1
  done
  [ "$(autoctl config get --pgdata "$1" "$2" 2>/dev/null)" = "$3" ]
}

pg_keeper_settings() { # pg_keeper_settings NODE: the keeper's own timeout and the monitor's
  # URI (a node made before the URI named its timeouts is given it), the server's settings
  # above (ALTER SYSTEM: they survive restarts and rewinds), then a reload
  local data="$PG_HA_DIR/node$1" setting
  keeper_config_set "$data" timeout.network_partition_timeout \
    "$PG_KEEPER_NETWORK_PARTITION_TIMEOUT" \
    || die "postgres: could not set node $1's network_partition_timeout"
  keeper_config_set "$data" pg_autoctl.monitor "$MONITOR_URI" \
    || die "postgres: could not give node $1 the monitor's URI"
  for setting in "${PG_NODE_SETTINGS[@]}"; do
    node_psql "$1" -q -c "ALTER SYSTEM SET ${setting%%=*} = '${setting#*=}'" \
      -c "SELECT pg_reload_conf()" >/dev/null || die "postgres: could not set ${setting%%=*} on node $1"
  done
  autoctl reload --pgdata "$data" >/dev/null 2>&1 || true
}

pg_trust_the_stack() { # pg_trust_the_stack PGDATA: the stack's own network trusted, as the
  # loopback is (--auth trust; pg_auto_failover trusts only its nodes' own addresses): the
  # host's clients come from the bridge's address. A running server reloads it.
  ha_netns || return 0
  local hba=$1/pg_hba.conf line added=""
  for line in "host all all $HA_NET.0/24 trust" "host replication all $HA_NET.0/24 trust"; do
    grep -qxF "$line" "$hba" || { echo "$line" >>"$hba"; added=1; }
  done
  [ -z "$added" ] || "${PG_AS[@]}" "$(pg_bindir)/pg_ctl" reload -s -D "$1" >/dev/null 2>&1 || true
}

pg_forget_keeper() { # pg_forget_keeper PGDATA: a keeper's files left from a removed PGDATA
  # pg_autoctl keeps each node's configuration and state outside its PGDATA (XDG
  # directories of the user it runs as, by the PGDATA's path); left behind when PGDATA is
  # deleted, they make the next `create` "continue" an old node and fail on its system
  # identifier.
  local home
  home=$( [ "$(id -u)" = 0 ] && getent passwd postgres | cut -d: -f6 || echo "$HOME")
  rm -rf "$home/.config/pg_autoctl$1" "$home/.local/share/pg_autoctl$1"
}

pg_node_start() { # pg_node_start NODE (1-3): its keeper started, creating the node if new
  local port=${PG_NODE_PORTS[$(($1 - 1))]} data="$PG_HA_DIR/node$1" addr
  addr=$(node_addr "pg$1")
  if node_listening "pg$1" "$port" || ! pg_keeper_gone "$data"; then
    step "postgres: node $1 already started ($addr:$port)"; return 0
  fi
  step "postgres: starting node $1 on $addr:$port"
  if [ -f "$data/PG_VERSION" ]; then
    # Its settings are set once the keeper runs (pg_node_up): `pg_autoctl config set`
    # signals the keeper named in its pid file, and a stale one left by a killed keeper may
    # name another process (keeper_config_set reads back what it wrote).
    # shellcheck disable=SC2046  # the namespace's prefix: words
    background "$HA_DIR/pg-node$1.log" $(node_exec "pg$1") "${PG_AS[@]}" \
      env PATH="$(pg_bindir):$PATH" pg_autoctl run --pgdata "$data"
  else
    pg_forget_keeper "$data"
    # LC_COLLATE=C: the initdb pg_autoctl runs makes its databases, payauth's among them,
    # compare text byte by byte (docs/operations.md, "The database's collation").
    # shellcheck disable=SC2046
    background "$HA_DIR/pg-node$1.log" $(node_exec "pg$1") "${PG_AS[@]}" \
      env PATH="$(pg_bindir):$PATH" LC_COLLATE=C pg_autoctl create postgres --pgdata "$data" \
      --pgport "$port" --hostname "$addr" --auth trust --no-ssl --monitor "$MONITOR_URI" \
      --dbname "$PG_DB" --run
  fi
}

pg_node_up() { # pg_node_up NODE (1-3): started (pg_node_start), then settled
  pg_node_start "$1"
  # The first node becomes the primary before the others ask to follow it; a node that
  # comes back after a failover rejoins as a secondary (pg_rewind or a new base backup).
  wait_for "node $1" 180 pg_node_settled "$1" \
    || die "postgres: node $1 did not settle, see $HA_DIR/pg-node$1.log"
  # The host's own connections come from the stack's network: trusted first (a node just
  # created trusts only its nodes' addresses, and would refuse the wait below).
  pg_trust_the_stack "$PG_HA_DIR/node$1"
  # (The monitor's view can be older than the server: a stack started again finds each node
  # as it left it, while its keeper is still starting its server.)
  wait_for "node $1's server" 60 node_psql "$1" -q -c "SELECT 1" \
    || die "postgres: node $1 does not accept connections, see $HA_DIR/pg-node$1.log"
  pg_keeper_settings "$1"  # once it runs (a node just created has its configuration only now)
}

pg_node_settled() { # the node reports single/primary/secondary; nudges a slow base backup
  local state; state=$(autoctl show state --pgdata "$PG_HA_DIR/monitor" 2>/dev/null || true)
  # pg_basebackup waits for a spread checkpoint on the primary: ask for an immediate one
  # (of every node: after a failover the primary is any of them)
  local node
  for node in 1 2 3; do
    PGCONNECT_TIMEOUT=2 node_psql "$node" -q -c CHECKPOINT >/dev/null 2>&1 || true
  done
  echo "$state" | grep -E "^ *node_$1 " | grep -Eq "\| +(single|primary|secondary) +\| +(single|primary|secondary) *$"
}

pg_sync_names() {
  local node
  for node in 1 2 3; do
    PGCONNECT_TIMEOUT=2 node_psql "$node" -tAc \
      "select current_setting('synchronous_standby_names') where not pg_is_in_recovery()" 2>/dev/null
  done | grep . || echo "no synchronous standby yet"
}

pg_keeper_gone() { ! pgrep -f "pg_autoctl .*--pgdata $1( |\$)" >/dev/null; }

pg_sync_on() { # both standbys in the primary's quorum: ANY 1 (name, name)
  pg_sync_names | grep -Eq "^ANY $PG_NUMBER_SYNC_STANDBYS \([^,]+,[^,]+\)$"
}

pg_ha_down() {
  local n order=(node3 node2 node1 monitor)  # the standbys and primary, then the monitor
  for n in "${order[@]}"; do
    [ -f "$PG_HA_DIR/$n/PG_VERSION" ] || continue
    step "postgres: stopping $n"
    autoctl stop --pgdata "$PG_HA_DIR/$n" >/dev/null 2>&1 || true
  done
  # `pg_autoctl stop` only asks: wait until each keeper has gone, or the next `up` finds it
  for n in "${order[@]}"; do
    [ -f "$PG_HA_DIR/$n/PG_VERSION" ] || continue
    wait_for "$n to stop" 60 pg_keeper_gone "$PG_HA_DIR/$n" || die "postgres: $n did not stop"
  done
}

# -------------------------------------------------------------------- Redis
redis_node() { # redis_node PORT: the node (r1 r2) that listens on PORT
  if [ "$1" = "$REDIS_MASTER_PORT" ]; then echo r1; else echo r2; fi
}

redis_node_up() { # redis_node_up PORT: start it unless it listens, as the replica of the
  # master the Sentinels name (a node back after a failover must not come back a master)
  local port=$1 node master_port=$REDIS_MASTER_PORT master
  node=$(redis_node "$port")
  node_listening "$node" "$port" && return 0
  if node_listening s1 "${SENTINEL_PORTS[0]}"; then
    master=$(redis-cli -h "$(node_addr s1)" -p "${SENTINEL_PORTS[0]}" \
               sentinel get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null | sed -n 2p)
    [ -n "$master" ] && master_port=$master
  fi
  local extra=()
  [ "$port" != "$master_port" ] \
    && extra=(--replicaof "$(node_addr "$(redis_node "$master_port")")" "$master_port")
  step "redis: starting $([ ${#extra[@]} = 0 ] && echo master || echo "replica of $master_port") on $(node_addr "$node"):$port"
  # shellcheck disable=SC2046  # the namespace's prefix: words
  # (protected mode off: it refuses every client not on the loopback when no password is
  # set, and the nodes, the Sentinels and the workers reach each other over the stack's own
  # network; the secured stack's Redis has passwords)
  $(node_exec "$node") redis-server --bind "$(node_addr "$node")" --port "$port" \
    --protected-mode no --daemonize yes --dir "$HA_DIR/redis" \
    --pidfile "$HA_DIR/redis/redis-$port.pid" --logfile "$HA_DIR/redis/redis-$port.log" \
    --save '' --appendonly no "${extra[@]}" >/dev/null || die "redis: $port failed to start"
}

redis_ha_up() {
  command -v redis-server >/dev/null 2>&1 || apt_install redis-server
  mkdir -p "$HA_DIR/redis"
  local port
  for port in "$REDIS_MASTER_PORT" "$REDIS_REPLICA_PORT"; do redis_node_up "$port"; done
  local i node
  for i in 0 1 2; do
    port=${SENTINEL_PORTS[$i]} node=s$((i + 1))
    node_listening "$node" "$port" && continue
    step "redis: starting Sentinel on $(node_addr "$node"):$port"
    printf '%s\n' "port $port" "bind $(node_addr "$node")" "protected-mode no" "daemonize yes" \
      "dir $HA_DIR/redis" \
      "pidfile $HA_DIR/redis/sentinel-$port.pid" "logfile $HA_DIR/redis/sentinel-$port.log" \
      "sentinel monitor $SENTINEL_MASTER $(node_addr r1) $REDIS_MASTER_PORT 2" \
      "sentinel down-after-milliseconds $SENTINEL_MASTER 2000" \
      "sentinel failover-timeout $SENTINEL_MASTER 10000" >"$HA_DIR/redis/sentinel-$port.conf"
    # shellcheck disable=SC2046
    $(node_exec "$node") redis-server "$HA_DIR/redis/sentinel-$port.conf" --sentinel >/dev/null \
      || die "redis: Sentinel $port failed to start"
  done
  wait_for sentinels 30 redis_sentinels_agree \
    || die "redis: the Sentinels do not see a master, its replica and each other, see $HA_DIR/redis/"
  step "redis: master, replica and three Sentinels ready"
}

redis_sentinels_agree() { # the first Sentinel sees the master up, a replica, two Sentinels
  local fields
  fields=$(redis-cli -h "$(node_addr s1)" -p "${SENTINEL_PORTS[0]}" sentinel master "$SENTINEL_MASTER" \
             2>/dev/null | paste - - | tr '\t' =) || return 1
  grep -qx "flags=master" <<<"$fields" && grep -qx "num-slaves=1" <<<"$fields" \
    && grep -qx "num-other-sentinels=2" <<<"$fields"
}

redis_ha_down() {
  local pidfile
  for pidfile in "$HA_DIR"/redis/*.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  step "redis: stopped"
}

# ------------------------------------------------------------------- worker
ha_env() {
  local brokers="" sentinels="" hosts="" i sslmode=""
  # The nodes in namespaces are not on the loopback: plaintext there is said, not implied
  # (TLS is the secured stack's subject, deploy/local/secure.sh); the URL is quoted for the
  # shell that sources this file (an & in it)
  ha_netns && sslmode="&sslmode=disable"
  for i in 0 1 2; do
    hosts+="${hosts:+,}$(node_addr "pg$((i + 1))"):${PG_NODE_PORTS[$i]}"
    brokers+="${brokers:+,}$(node_addr "k$((i + 1))"):${KAFKA_PORTS[$i]}"
    sentinels+="${sentinels:+,}$(node_addr "s$((i + 1))"):${SENTINEL_PORTS[$i]}"
  done
  cat <<ENV
PAYAUTH_KAFKA_BOOTSTRAP_SERVERS=$brokers
PAYAUTH_DATABASE_URL='postgresql://postgres@$hosts/$PG_DB?target_session_attrs=read-write$sslmode'
PAYAUTH_REDIS_SENTINELS=$sentinels
PAYAUTH_REDIS_SENTINEL_MASTER=$SENTINEL_MASTER
ENV
}

ha_layout_check() { # data made for another network (a node's address is in it) is made anew
  local file=$HA_DIR/layout want had
  want=$(ha_layout); had=$(cat "$file" 2>/dev/null || echo loopback)
  if [ "$had" != "$want" ] \
     && { [ -e "$PG_HA_DIR/monitor" ] || compgen -G "$HA_DIR/kafka-[123]" >/dev/null; }; then
    step "the nodes' data was made for another network ($had): made anew for $want"
    kafka_ha_down; redis_ha_down; pg_ha_down
    ha_data_remove
  fi
  echo "$want" >"$file"
}

ha_data_remove() { # every node's data (and the keepers' files outside it): made anew by `up`
  rm -rf "$HA_DIR"/kafka-[123] "$HA_DIR/kafka-cluster-id"
  local n
  for n in monitor node1 node2 node3; do
    pg_forget_keeper "$PG_HA_DIR/$n"; rm -rf "${PG_HA_DIR:?}/$n"
  done
  rm -rf "${PG_HA_DIR:?}/backup"
}

ha_down() { # every node stopped, then the namespaces removed
  kafka_ha_down; redis_ha_down; pg_ha_down; net_down
}

ha_wipe() { # stopped, then nothing left of it: the next `up` starts as on a new machine
  ha_down
  ha_data_remove
  rm -rf "${HA_DIR:?}/redis" "$HA_DIR/layout" "$HA_DIR/nodes" "$STACK_DIR/ha.env"
  step "ha stack is down, its data deleted: the next ha-up makes every node anew"
}

ha_up() {
  mkdir -p "$HA_DIR"
  ha_layout_check
  net_up
  net_nodes_file >"$HA_DIR/nodes"
  pg_ha_up
  redis_ha_up
  kafka_ha_up
  ha_env >"$STACK_DIR/ha.env"
  local py=${PYTHON:-$ROOT/.venv/bin/python}
  (set -a; . "$STACK_DIR/ha.env"; set +a
   step "postgres: applying the migrations"
   PAYAUTH_LOG_LEVEL=WARNING "$py" -m service migrate >/dev/null || die "postgres: migrations failed"
   step "kafka: ensuring topics (replication factor 3)"
   "$py" -m service topics --partitions "$INPUT_PARTITIONS" --wait 120 >/dev/null \
     || die "kafka: could not create the topics")
  step "ha stack is up; for a worker: set -a; . .stack/ha.env; set +a; payauth run"
  cat "$STACK_DIR/ha.env"
}

ha_status() {
  echo "PostgreSQL (pg_auto_failover):"
  autoctl show state --pgdata "$PG_HA_DIR/monitor" 2>/dev/null | sed 's/^/  /' || echo "  monitor down"
  echo "Redis master (Sentinel $SENTINEL_MASTER):"
  redis-cli -h "$(node_addr s1)" -p "${SENTINEL_PORTS[0]}" sentinel get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null \
    | paste -sd: | sed 's/^/  /' || echo "  Sentinels down"
  echo "Kafka partition leaders:"
  local py=${PYTHON:-$ROOT/.venv/bin/python} i any=""
  for i in 0 1 2; do node_listening "k$((i + 1))" "${KAFKA_PORTS[$i]}" && any=1; done
  [ -n "$any" ] || { echo "  brokers down"; return 0; }
  (set -a; [ -f "$STACK_DIR/ha.env" ] && . "$STACK_DIR/ha.env"; set +a
   "$py" - <<'PY' || echo "  brokers down"
import os
from confluent_kafka.admin import AdminClient
admin = AdminClient({"bootstrap.servers": os.environ["PAYAUTH_KAFKA_BOOTSTRAP_SERVERS"]})
meta = admin.list_topics(timeout=10)
for name in sorted(t for t in meta.topics if t.startswith("payments.")):
    parts = meta.topics[name].partitions
    leaders = {}
    for p in parts.values():
        leaders.setdefault(p.leader, []).append(p.id)
    print(f"  {name}: " + "; ".join(f"node {n} leads {len(ps)}" for n, ps in sorted(leaders.items()))
          + f" (in sync: {min(len(p.isrs) for p in parts.values())} of {len(next(iter(parts.values())).replicas)} at least)")
PY
  )
}

mkdir -p "$HA_DIR"
case "${1:-}" in
  up) ha_up ;;
  down) ha_down; step "ha stack is down" ;;
  wipe) ha_wipe ;;
  status) ha_status ;;
  # One node (re)started, for the HA chaos run after it killed that node:
  kafka-node-up) kafka_fetch; kafka_node_up "$2"; kafka_node_wait "$2" ;;
  pg-node-up) pg_node_up "$2" ;;
  redis-node-up) redis_node_up "$2" ;;
  *) echo "usage: $0 up|down|wipe|status|kafka-node-up N|pg-node-up N|redis-node-up PORT" >&2; exit 2 ;;
esac
