#!/usr/bin/env bash
# The container engine this project drives, with the project's own configuration:
#   deploy/image/engine.sh ARGS...    runs `docker ARGS` when a Docker daemon answers, else
#                                     `podman ARGS` (installed from Debian when missing)
#   deploy/image/engine.sh --which    prints docker or podman (installing podman if needed)
#   deploy/image/engine.sh --env      prints the variables podman needs (shell-sourceable)
#
# podman gets a containers.conf and a storage.conf written under .stack/podman/: its images
# and containers live there (git-ignored), not in the machine's shared store, and the
# settings this kind of host needs are set once: runc with cgroupfs (crun refuses hybrid
# cgroups), open-files and process limits within the host's hard limits (podman's default
# asks for more than some hosts allow, and every `run` then fails).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
CONF_DIR="$ROOT/.stack/podman"

docker_answers() {
  command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1
}

install_podman() {
  # A docker client without a daemon (common in CI images) does not count as an engine.
  echo "[image] no container engine answers: installing podman and runc from Debian" >&2
  if [ "$(id -u)" != 0 ]; then
    echo "[image] installing podman needs root: run as root or install podman yourself" >&2
    exit 1
  fi
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc >/dev/null
}

write_podman_conf() {
  mkdir -p "$CONF_DIR/storage"
  # Per-boot state belongs on /run (a tmpfs); one directory per checkout so two clones on
  # one host never share it. Unix socket paths are short there, as conmon needs.
  local run_dir
  run_dir="/run/payauth-podman-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12)"
  local nofile nproc
  nofile=$(ulimit -Hn); [ "$nofile" = unlimited ] && nofile=1048576
  [ "$nofile" -gt 65536 ] && nofile=65536
  nproc=$(ulimit -Hu); [ "$nproc" = unlimited ] && nproc=4096
  [ "$nproc" -gt 4096 ] && nproc=4096
  local runtime=runc
  command -v runc >/dev/null 2>&1 || runtime=crun
  cat >"$CONF_DIR/containers.conf.new" <<CONF
# Written by deploy/image/engine.sh for this checkout; regenerated on every call.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "$runtime"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$run_dir/libpod"
CONF
  cat >"$CONF_DIR/storage.conf.new" <<CONF
# Written by deploy/image/engine.sh for this checkout; regenerated on every call.
[storage]
driver = "overlay"
graphroot = "$CONF_DIR/storage"
runroot = "$run_dir/storage"
CONF
  mv "$CONF_DIR/containers.conf.new" "$CONF_DIR/containers.conf"
  mv "$CONF_DIR/storage.conf.new" "$CONF_DIR/storage.conf"
}

choose() {
  if [ -n "${PAYAUTH_ENGINE:-}" ]; then echo "$PAYAUTH_ENGINE"; return; fi
  if docker_answers; then echo docker; return; fi
  command -v podman >/dev/null 2>&1 || install_podman
  echo podman
}

engine=$(choose)
if [ "$engine" = podman ]; then
  write_podman_conf
  export CONTAINERS_CONF="$CONF_DIR/containers.conf"
  export CONTAINERS_STORAGE_CONF="$CONF_DIR/storage.conf"
fi

case "${1:-}" in
  --which) echo "$engine" ;;
  --env)
    if [ "$engine" = podman ]; then
      echo "CONTAINERS_CONF=$CONTAINERS_CONF"
      echo "CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF"
    fi ;;
  *) exec "$engine" "$@" ;;
esac
