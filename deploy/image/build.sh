#!/usr/bin/env bash
# make image: build payauth:local from the Dockerfile with whichever engine this machine has
# (deploy/image/engine.sh: docker when a daemon answers, else podman).
#
#   IMAGE_TAG   the tag (default payauth:local)
#   BASE_IMAGE  the base (default python:3.11-slim). When it cannot be pulled (no registry
#               reachable), a stand-in of the same Python minor version is built from Debian
#               packages with mmdebstrap, and the build says so in one line.
#   WHEELHOUSE  a directory of wheels to install from instead of downloading them (an
#               offline build from a bank's own artifact store); pip still checks every
#               hash in requirements.lock.
#   PYTHON      the host's Python that downloads the wheelhouse (default python3)
#
# Pip never runs against an index inside the build: the host downloads the locked wheels
# (through its own pip configuration, proxy and CA bundle included) into .wheelhouse/, the
# build stage installs from there with --no-index --require-hashes, and neither the wheels
# nor any pip configuration reach the final image.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
ENGINE="$ROOT/deploy/image/engine.sh"
TAG="${IMAGE_TAG:-payauth:local}"
BASE="${BASE_IMAGE:-python:3.11-slim}"
PYTHON="${PYTHON:-python3}"
STANDIN="localhost/payauth-base:3.11-bookworm"
engine=$("$ENGINE" --which)
started=$(date +%s)

base_available() {
  "$ENGINE" image inspect "$1" >/dev/null 2>&1 && return 0
  timeout 60 "$ENGINE" pull -q "$1" >/dev/null 2>&1
}

standin_base() {
  # Debian bookworm's python3 is 3.11, the minor version of python:3.11-slim and of the
  # lock. python-is-python3 gives `python`; passwd (in minbase) gives useradd. The /usr
  # merge is asserted by usr-is-merged, so usrmerge and the full perl it pulls in (about
  # 55 MB) are purged once the tree is built: nothing at run time needs them.
  if "$ENGINE" image inspect "$STANDIN" >/dev/null 2>&1; then return; fi
  command -v mmdebstrap >/dev/null 2>&1 || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap >/dev/null
  }
  local tar="$ROOT/.stack/image/rootfs.tar"
  mkdir -p "$(dirname "$tar")"
  mmdebstrap --quiet --variant=minbase \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --include=usr-is-merged \
    --customize-hook='chroot "$1" dpkg --purge usrmerge libfile-find-rule-perl libnumber-compare-perl libtext-glob-perl perl perl-modules-5.36 libperl5.36' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
    bookworm "$tar"
  "$ENGINE" import --change 'CMD ["python3"]' "$tar" "$STANDIN" >/dev/null 2>&1
  rm -f "$tar"
}

if ! base_available "$BASE"; then
  echo "[image] $BASE cannot be pulled here: building on a stand-in base from Debian bookworm packages (Python 3.11), $STANDIN"
  standin_base
  BASE="$STANDIN"
fi

# The wheelhouse: the caller's, or downloaded by the host now (only the locked versions,
# binary wheels for CPython 3.11 on Linux x86_64, every hash checked).
rm -rf .wheelhouse
mkdir -p .wheelhouse
if [ -n "${WHEELHOUSE:-}" ]; then
  cp "$WHEELHOUSE"/*.whl .wheelhouse/
else
  "$PYTHON" -m pip download -q --require-hashes --only-binary=:all: --no-deps \
    --python-version 3.11 --implementation cp --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -r requirements.lock -d .wheelhouse
fi

format=()
# podman builds OCI images by default, and the OCI format has no HEALTHCHECK.
[ "$engine" = podman ] && format=(--format docker)
# No network in the build: everything it installs is in the wheelhouse, checked by hash.
"$ENGINE" build -q --network=none "${format[@]}" --build-arg "BASE_IMAGE=$BASE" -t "$TAG" -f Dockerfile . >/dev/null
rm -rf .wheelhouse

size=$("$ENGINE" image inspect "$TAG" --format '{{.Size}}')
echo "[image] $TAG built with $engine on $BASE in $(( $(date +%s) - started )) s, $(( size / 1000000 )) MB"
