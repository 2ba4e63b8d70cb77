#!/usr/bin/env bash
# A real Kubernetes API server for the deploy tests: etcd and kube-apiserver of one pinned
# release on 127.0.0.1, with kubectl of the same release. No kubelet and no controllers: the
# server validates, defaults, admits (Pod Security included) and stores what is applied;
# nothing runs. Idempotent: an API server of this stack that answers is reused.
#
#   deploy/local/k8s-api.sh up | down | status
#   deploy/local/k8s-api.sh pin KUBERNETES_VERSION ETCD_VERSION   (re-pin, as `make lock`)
#
# The three programs are built from the Go module proxy, once, into a cache outside the
# repository ($K8S_CACHE, one directory per content of the wrapper modules). The wrapper
# modules in k8s-api/ pin every module by hash (go.sum): k8s.io/kubernetes does not publish
# its staging modules at the versions its go.mod names (v0.0.0), so its wrapper replaces each
# with the published k8s.io/NAME v0.X.Y of the same release. State lives in $STACK_DIR/k8s:
# the kubeconfig, bin/kubectl, the server's keys, etcd's data, and kubectl's discovery cache
# (cache/; pass --cache-dir, as the tests do, so a new server on the same port is never
# described by the last one's). `down` stops both processes and removes that state: the
# next `up` starts an empty server.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=stack.sh
STACK_FUNCTIONS_ONLY=1 source "$HERE/stack.sh"

step() { printf '[k8s-api] %s\n' "$*"; }
die() { printf '[k8s-api] ERROR: %s\n' "$*" >&2; exit 1; }

MODULES=$HERE/k8s-api
K8S_API_PORT=${K8S_API_PORT:-16443}
K8S_ETCD_PORT=${K8S_ETCD_PORT:-12379}
K8S_ETCD_PEER_PORT=${K8S_ETCD_PEER_PORT:-12380}
K8S_CACHE=${K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/payauth/k8s}
DIR=$STACK_DIR/k8s
KUBECONFIG_FILE=$DIR/kubeconfig
KUBECTL=$DIR/bin/kubectl

required_version() { # required_version GO_MOD MODULE: the version the wrapper requires
  awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1"
}
K8S_VERSION=$(required_version "$MODULES/kubernetes/go.mod" k8s.io/kubernetes)
ETCD_VERSION=$(required_version "$MODULES/etcd/go.mod" go.etcd.io/etcd/server/v3)

need_go() {
  command -v go >/dev/null 2>&1 \
    || die "go not found: the API server is built from the Go module proxy; install Go >= 1.26"
}

# ------------------------------------------------------------------------------ build
build_key() { cat "$MODULES"/*/go.mod "$MODULES"/*/go.sum | sha256sum | cut -c1-16; }
BIN=$K8S_CACHE/$K8S_VERSION-$(build_key)

build() {
  if [ -f "$BIN/.complete" ]; then return; fi
  need_go
  local partial=$BIN.partial log=$K8S_CACHE/build-$K8S_VERSION.log
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  local version="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION
    -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor
    -X k8s.io/component-base/version.gitTreeState=clean
    -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION
    -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
  rm -rf "$partial"; mkdir -p "$partial"
  step "building kube-apiserver and kubectl $K8S_VERSION, etcd $ETCD_VERSION from the Go module proxy" \
       "(first run only, about 5 minutes on 2 cores; log: $log)"
  # -mod=readonly: the committed go.sum is the pin; a module that does not match it fails.
  {
    GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -C "$MODULES/kubernetes" -trimpath \
      -ldflags "-s -w $version" -o "$partial/" \
      k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl \
    && GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -C "$MODULES/etcd" -trimpath \
      -ldflags "-s -w" -o "$partial/etcd" go.etcd.io/etcd/server/v3
  } >"$log" 2>&1 || die "the build failed, see $log"
  touch "$partial/.complete"
  rm -rf "$BIN"; mv "$partial" "$BIN"
  step "built into $BIN"
}

# --------------------------------------------------------------------------- servers
kubectl_() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" --cache-dir "$DIR/cache" "$@"; }

answers() { [ -x "$KUBECTL" ] && [ -f "$KUBECONFIG_FILE" ] \
  && kubectl_ --request-timeout=5s get --raw /readyz >/dev/null 2>&1; }

start() { # start NAME COMMAND...: in the background, outliving this script; pid in $DIR
  local name=$1; shift
  setsid nohup "$@" >"$DIR/$name.log" 2>&1 </dev/null &
  echo $! >"$DIR/$name.pid"
}

running() { kill -0 "$(cat "$DIR/$1.pid" 2>/dev/null)" 2>/dev/null; }
ready_or_gone() { answers || ! running "$1"; }  # stops the wait early when it has died

stop_ours() {
  local name
  for name in kube-apiserver etcd; do
    if [ -f "$DIR/$name.pid" ]; then stop_pidfile "$name" "$DIR/$name.pid"; fi
  done
}

write_kubeconfig() {
  cat >"$KUBECONFIG_FILE" <<EOF
# The local API server of deploy/local/k8s-api.sh (a scratch server: no kubelet, nothing runs).
apiVersion: v1
kind: Config
clusters:
  - name: payauth-local
    cluster:
      server: https://127.0.0.1:$K8S_API_PORT
      certificate-authority: $DIR/pki/apiserver.crt
users:
  - name: admin
    user:
      token: $1
contexts:
  - name: payauth-local
    context: {cluster: payauth-local, user: admin}
current-context: payauth-local
EOF
  chmod 600 "$KUBECONFIG_FILE"
}

up() {
  mkdir -p "$DIR/bin"
  if answers; then
    step "API server already up: $KUBECONFIG_FILE, kubectl at $KUBECTL"
    return
  fi
  stop_ours  # what a killed run left
  for port in "$K8S_API_PORT" "$K8S_ETCD_PORT" "$K8S_ETCD_PEER_PORT"; do
    if listening "$port"; then
      die "port $port is taken by something that is not this stack's API server (another" \
        "checkout's? run make k8s-api-down there), or set K8S_API_PORT and K8S_ETCD_PORT"
    fi
  done
  build
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  rm -rf "$DIR/etcd" "$DIR/pki" "$DIR/cache" "$KUBECONFIG_FILE"
  mkdir -p "$DIR/pki"
  # The key that signs and checks service-account tokens, and the admin's bearer token.
  openssl genrsa -out "$DIR/pki/sa.key" 2048 >/dev/null 2>&1 || die "openssl genrsa failed"
  local token; token=$(openssl rand -hex 24)
  echo "$token,admin,admin,system:masters" >"$DIR/pki/tokens.csv"
  chmod 600 "$DIR/pki/sa.key" "$DIR/pki/tokens.csv"
  ln -sfn "$BIN/kubectl" "$KUBECTL"

  step "etcd $ETCD_VERSION: starting on 127.0.0.1:$K8S_ETCD_PORT"
  # --unsafe-no-fsync: a scratch store for tests, removed by `down`.
  start etcd "$BIN/etcd" --name payauth-local --data-dir "$DIR/etcd" --log-level warn \
    --listen-client-urls "http://127.0.0.1:$K8S_ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$K8S_ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$K8S_ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$K8S_ETCD_PEER_PORT" \
    --initial-cluster "payauth-local=http://127.0.0.1:$K8S_ETCD_PEER_PORT" --unsafe-no-fsync
  wait_for etcd 30 listening "$K8S_ETCD_PORT" && running etcd \
    || die "etcd did not start, see $DIR/etcd.log"

  step "kube-apiserver $K8S_VERSION: starting on https://127.0.0.1:$K8S_API_PORT"
  # Its serving certificate is self-signed into --cert-dir (the kubeconfig trusts that file).
  # Admission is the release's default set: Pod Security and ServiceAccount among it. No
  # endpoint reconciler: it refuses a loopback address for the `kubernetes` Service.
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$K8S_ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$K8S_API_PORT" \
    --cert-dir "$DIR/pki" --token-auth-file "$DIR/pki/tokens.csv" --authorization-mode RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$DIR/pki/sa.key" \
    --service-account-signing-key-file "$DIR/pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 --profiling=false --endpoint-reconciler-type none
  write_kubeconfig "$token"
  wait_for kube-apiserver 90 ready_or_gone kube-apiserver \
    && running kube-apiserver || die "kube-apiserver did not become ready, see $DIR/kube-apiserver.log"
  step "API server ready: KUBECONFIG=$KUBECONFIG_FILE $KUBECTL get --raw /readyz"
}

down() {
  stop_ours
  rm -rf "$DIR/etcd" "$DIR/pki" "$DIR/cache" "$KUBECONFIG_FILE" "$KUBECTL"
  step "API server is down"
}

status() {
  if answers; then
    echo "k8s-api: up (https://127.0.0.1:$K8S_API_PORT, $(kubectl_ version -o json \
      | awk -F'"' '/gitVersion/ {v=$4} END {print v}'), KUBECONFIG=$KUBECONFIG_FILE)"
  else
    echo "k8s-api: down ($K8S_API_PORT)"
  fi
}

# ----------------------------------------------------------------------------- pin
pin() { # pin KUBERNETES_VERSION ETCD_VERSION: rewrite the wrapper modules (needs the proxy)
  local k8s=${1:?usage: pin KUBERNETES_VERSION ETCD_VERSION} etcd=${2:?usage: pin KUBERNETES_VERSION ETCD_VERSION}
  need_go
  local staging=v0.${k8s#v1.} dir=$MODULES/kubernetes mod
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init payauth.local/k8s-api/kubernetes >/dev/null 2>&1)
  mod=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$k8s" | awk -F'"' '/"GoMod"/ {print $4}')
  [ -f "$mod" ] || die "k8s.io/kubernetes@$k8s: not served by the module proxy"
  (cd "$dir" && go mod edit -go="$(awk '$1 == "go" {print $2}' "$mod")" -require="k8s.io/kubernetes@$k8s")
  # every staging module its go.mod names at v0.0.0, at the release's published version
  awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$mod" | sort -u | while read -r name; do
    (cd "$dir" && go mod edit -replace="$name=$name@$staging")
  done
  (cd "$dir" && go get -tool k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl \
    && go mod tidy) || die "could not resolve the kubernetes wrapper module"
  dir=$MODULES/etcd
  rm -f "$dir/go.mod" "$dir/go.sum"
  (cd "$dir" && go mod init payauth.local/k8s-api/etcd >/dev/null 2>&1 \
    && go mod edit -go="$(awk '$1 == "go" {print $2}' "$MODULES/kubernetes/go.mod")" \
    && go get -tool "go.etcd.io/etcd/server/v3@$etcd" && go mod tidy) \
    || die "could not resolve the etcd wrapper module"
  step "pinned Kubernetes $k8s and etcd $etcd in $MODULES"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  pin) shift; pin "$@" ;;
  *) echo "usage: $0 up|down|status|pin KUBERNETES_VERSION ETCD_VERSION" >&2; exit 2 ;;
esac
