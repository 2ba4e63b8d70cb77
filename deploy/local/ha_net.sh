# The replicated stack's network (sourced by ha.sh): as root, each engine node in a network
# namespace of its own, so that a fault can split the cluster (a node that some peers
# cannot reach while it still reaches others; see service/devtools/chaos/netsplit.py).
#
#   a bridge $HA_BRIDGE in the host's namespace, address $HA_NET.1: the workers, the load,
#   the checker and the operator's commands reach every node from there, as clients would;
#   one namespace per node (payauth-NODE), its end of a veth pair (eth0) on the bridge, an
#   address of its own, and its own loopback. Nothing outside these namespaces and this
#   bridge is touched; `ha.sh down` removes them all, also after a run that was killed.
#
# Not root, HA_NETNS=0, or namespaces refused: every node on the loopback, and no partition
# can be made.
#
# The nodes (their ports are ha.sh's: each node keeps its own, so a port still names it):
#   pgm the pg_auto_failover monitor; pg1-pg3 the PostgreSQL nodes; k1-k3 the Kafka nodes;
#   r1 r2 the Redis nodes (first master, replica); s1-s3 the Sentinels; and w1-w3, where the
#   HA chaos run starts its three workers (nothing runs there otherwise), so that one worker
#   can be cut from Kafka while it still reaches PostgreSQL.
HA_NET=${HA_NET:-10.77.42}  # a /24 of the stack's own, unused on the host's networks
HA_BRIDGE=pa-ha0
HA_NS_PREFIX=payauth-
HA_NODES=(pgm pg1 pg2 pg3 k1 k2 k3 r1 r2 s1 s2 s3 w1 w2 w3)
declare -A HA_NODE_OCTET=([pgm]=10 [pg1]=11 [pg2]=12 [pg3]=13 [k1]=21 [k2]=22 [k3]=23
                          [r1]=31 [r2]=32 [s1]=41 [s2]=42 [s3]=43 [w1]=51 [w2]=52 [w3]=53)

# As root, unless HA_NETNS=0 or the host refuses network namespaces (a container without
# CAP_NET_ADMIN, say): then, said in a line, every node on the loopback.
if [ -z "${HA_NETNS:-}" ]; then
  HA_NETNS=0
  if [ "$(id -u)" = 0 ]; then
    command -v ip >/dev/null 2>&1 || apt_install iproute2
    if ip netns add payauth-probe 2>/dev/null; then
      ip netns del payauth-probe; HA_NETNS=1
    else
      printf '[ha] network namespaces refused on this host: every node on the loopback, no partition can be made\n' >&2
    fi
  fi
fi
ha_netns() { [ "$HA_NETNS" != 0 ]; }

# The layout the nodes' data was made for: a node's address is written into its data (the
# monitor's node list, the Kafka quorum's voters), so data made for another layout is made
# anew rather than left to fail.
ha_layout() { if ha_netns; then echo "netns $HA_NET.0/24"; else echo loopback; fi; }

node_addr() { # node_addr NODE: the address the node listens on and is reached at
  if ha_netns; then echo "$HA_NET.${HA_NODE_OCTET[$1]}"; else echo 127.0.0.1; fi
}

node_listening() { # node_listening NODE PORT
  (exec 3<>"/dev/tcp/$(node_addr "$1")/$2") 2>/dev/null
}

net_up() {
  ha_netns || return 0
  command -v ip >/dev/null 2>&1 || apt_install iproute2
  command -v nft >/dev/null 2>&1 || apt_install nftables
  if ! ip link show "$HA_BRIDGE" >/dev/null 2>&1; then
    ip link add "$HA_BRIDGE" type bridge || die "net: could not create the bridge $HA_BRIDGE"
  fi
  ip addr replace "$HA_NET.1/24" dev "$HA_BRIDGE"
  ip link set "$HA_BRIDGE" up
  local node ns veth
  for node in "${HA_NODES[@]}"; do
    ns=$HA_NS_PREFIX$node veth=pa-$node
    ip netns list | grep -qw "^$ns" || ip netns add "$ns" || die "net: could not create $ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
      ip link add "$veth" type veth peer name eth0 netns "$ns" \
        || die "net: could not create the link of $node"
    fi
    ip link set "$veth" master "$HA_BRIDGE" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr replace "$(node_addr "$node")/24" dev eth0
    ip -n "$ns" link set eth0 up
  done
  # Bridged frames pass the host's iptables FORWARD chain where br_netfilter is loaded; a
  # host whose policy drops them (a Docker host) would keep the nodes apart.
  if [ "$(cat /proc/sys/net/bridge/bridge-nf-call-iptables 2>/dev/null)" = 1 ] \
     && command -v iptables >/dev/null 2>&1 \
     && ! iptables -C FORWARD -i "$HA_BRIDGE" -o "$HA_BRIDGE" -j ACCEPT 2>/dev/null; then
    iptables -I FORWARD -i "$HA_BRIDGE" -o "$HA_BRIDGE" -j ACCEPT 2>/dev/null || true
  fi
  step "net: ${#HA_NODES[@]} namespaces on $HA_BRIDGE ($HA_NET.0/24)"
}

net_down() { # after the nodes were stopped: whatever still runs in a namespace is killed
  ha_netns || return 0
  local node ns pids
  for node in "${HA_NODES[@]}"; do
    ns=$HA_NS_PREFIX$node
    ip netns list | grep -qw "^$ns" || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      step "net: killing what still runs in $ns ($(echo $pids))"
      # shellcheck disable=SC2086  # a list of pids
      kill -CONT $pids 2>/dev/null || true; kill -9 $pids 2>/dev/null || true
    fi
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$HA_BRIDGE" 2>/dev/null || true
  iptables -D FORWARD -i "$HA_BRIDGE" -o "$HA_BRIDGE" -j ACCEPT 2>/dev/null || true
  step "net: namespaces and bridge removed"
}

bridge_addr() { # where the host's namespace is reached from a node's (the proxies listen)
  if ha_netns; then echo "$HA_NET.1"; else echo 127.0.0.1; fi
}

net_nodes_file() { # what the chaos run reads: a line per node, its address and namespace
  local node
  echo "bridge $(bridge_addr) -"
  for node in "${HA_NODES[@]}"; do
    if ha_netns; then echo "$node $(node_addr "$node") $HA_NS_PREFIX$node"
    else echo "$node $(node_addr "$node") -"; fi
  done
}
