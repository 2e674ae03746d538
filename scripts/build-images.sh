#!/usr/bin/env bash
# Builds hotset's three images with a running Docker engine:
#   hotset-operator:$TAG  (Dockerfile.operator; the router runs from it too)
#   hotset-worker:$TAG    (Dockerfile.worker)
#   hotset-triton-cpu:$TAG (Dockerfile.triton-cpu: the CPU Triton sidecar)
#   hotset-s3:$TAG        (Dockerfile.s3: MinIO for the kind tier's s3:// scenario only)
#   hotset-registry:$TAG  (Dockerfile.registry: the distribution registry, its oci:// scenario)
# Wheels: each image's requirement set is downloaded into
# ~/.cache/hotset/wheels/<pyproject hash>/<image> only when that image must be built
# (pip reads its HTTP cache where it has one; only index pages go out), served to the
# build over the Docker bridge (this machine only) as PIP_FIND_LINKS with
# PIP_NO_INDEX=1, and dropped once the image is built: the worker's set is 3 GB
# (torch and its CUDA wheels) that the kind tier's nodes need more (docs/e2e.md,
# "Disk"). HOTSET_KEEP_IMAGE_WHEELS=1 keeps them for the next rebuild. Where no registry
# answers (HOTSET_LOCAL_BASE=1, the default on machines without CAP_SYS_RESOURCE)
# the base is scripts/base-images.sh's hotset-base/python; elsewhere the official
# python:3.11-slim and debian:bookworm-slim. Prints each build's time and size.
#   scripts/build-images.sh [TAG] (default e2e)
#   scripts/build-images.sh --wheels-only   (gather the wheels, build nothing)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WHEELS_ONLY=0
[ "${1:-}" = "--wheels-only" ] && { WHEELS_ONLY=1; shift; }
TAG="${1:-e2e}"
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"
PIP=.venv/bin/pip
PYTHON=.venv/bin/python

if [ $WHEELS_ONLY = 1 ]; then :
elif [ -z "${HOTSET_LOCAL_BASE:-}" ]; then
  # CAP_SYS_RESOURCE is bit 24 of the bounding set: without it this is a machine of the
  # project's workplace, where no registry answers.
  if (( (16#$(awk '/^CapBnd/ {print $2}' /proc/self/status) >> 24) & 1 )); then HOTSET_LOCAL_BASE=0; else HOTSET_LOCAL_BASE=1; fi
fi
if [ $WHEELS_ONLY = 1 ]; then :
elif [ "$HOTSET_LOCAL_BASE" = 1 ]; then
  scripts/base-images.sh
  PYTHON_BASE=hotset-base/python:bookworm
  DEBIAN_BASE=hotset-base/python:bookworm
else
  PYTHON_BASE=python:3.11-slim
  DEBIAN_BASE=debian:bookworm-slim
fi

key=$(cat pyproject.toml | sha1sum | cut -c1-12)
WHEELS="$CACHE/wheels/$key"

# requirements EXTRAS: the project's dependencies plus those of the given extras.
requirements() {
  "$PYTHON" -c "import sys, tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + [r for e in sys.argv[1].split(',') for r in p['optional-dependencies'][e]]))" "$1"
}

# wants NAME EXTRAS [EXTRA_REQUIREMENT...]: write the requirement list of one image's wheel
# set (cheap; part of the image's key), without downloading anything.
wants() {
  local name=$1 extras=$2; shift 2
  local dir="$WHEELS/$name"
  mkdir -p "$dir"
  { if [ -n "$extras" ]; then requirements "$extras"; fi; printf '%s\n' "$@"; } > "$dir/requirements.txt"
}

# wheels NAME: download the wheel set NAME's requirement list names, unless it is there.
wheels() {
  local dir="$WHEELS/$1"
  [ -f "$dir/.complete" ] && return 0
  echo "build-images: gathering $1 wheels"
  "$PIP" download -q --only-binary=:all: -d "$dir" -r "$dir/requirements.txt"
  touch "$dir/.complete"
}

# drop_wheels NAME: free a wheel set once its image is built (its requirement list stays).
drop_wheels() {
  [ "${HOTSET_KEEP_IMAGE_WHEELS:-0}" = 1 ] && return 0
  find "$WHEELS/$1" -mindepth 1 ! -name requirements.txt -delete
}

# bridge_address: the host's address on the Docker bridge that build containers use, read from
# the bridge interface itself. dockerd names no Gateway in `docker network inspect bridge` on its
# first start on a machine (where it creates docker0), so that field is only a fallback.
bridge_address() {
  local name address
  name=$(docker network inspect bridge -f '{{index .Options "com.docker.network.bridge.name"}}' 2>/dev/null || true)
  if [ -n "$name" ]; then
    address=$(ip -4 -o addr show dev "$name" 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
  fi
  [ -n "${address:-}" ] || address=$(docker network inspect bridge -f '{{range .IPAM.Config}}{{.Gateway}}{{end}}')
  if [ -z "$address" ]; then
    echo "build-images: no address of the Docker bridge (${name:-unnamed}) on this machine to serve wheels on" >&2
    exit 1
  fi
  echo "$address"
}

# serve NAME: an HTTP server for one image's wheels on the Docker bridge's address, reachable from
# build containers on this machine only; sets WHEEL_URL, stopped by pid on exit.
SERVER_PID=""
serve() {  # serve NAME KEY
  local key=$2
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  local gateway port
  gateway=$(bridge_address)
  # A port fixed per wheel set when free: the URL is a build argument, so part of Docker's cache key.
  port=$("$PYTHON" -c 'import socket, sys
s = socket.socket()
try:
    s.bind((sys.argv[1], 20000 + int(sys.argv[2], 16) % 10000))
except OSError:
    s.bind((sys.argv[1], 0))
print(s.getsockname()[1])' "$gateway" "$key")
  "$PYTHON" -m http.server --bind "$gateway" --directory "$WHEELS/$1" "$port" >/dev/null 2>&1 &
  SERVER_PID=$!
  WHEEL_URL="http://$gateway:$port/"
  for _ in $(seq 50); do curl -sf -o /dev/null "$WHEEL_URL" && return 0; sleep 0.1; done
  echo "build-images: the wheel server on $WHEEL_URL did not start" >&2; exit 1
}

# build IMAGE DOCKERFILE BASE WHEELS: docker build with the image's wheels served, no index;
# report time and size. Skipped when the image already carries the hash of its inputs
# (Dockerfile, sources, wheels, base); an image it replaces is pruned.
build() {
  local image=$1 dockerfile=$2 base=$3 wheels=$4 start=$SECONDS key size
  key=$( { docker image inspect -f '{{.Id}}' "$base" 2>/dev/null || echo "$base"; cat "$dockerfile" pyproject.toml README.md;
           find common operator router worker-image -name '*.py' -o -name '*.json' | sort | xargs cat;
           cat "$WHEELS/$wheels/requirements.txt"; } | sha1sum | cut -c1-12)
  if [ "$(docker image inspect -f '{{ index .Config.Labels "hotset.inputs" }}' "$image" 2>/dev/null)" = "$key" ]; then
    echo "build-images: $image is up to date"
    return 0
  fi
  wheels "$wheels"
  serve "$wheels" "$(echo "$wheels $WHEELS" | sha1sum | cut -c1-8)"
  echo "build-images: building $image from $dockerfile (base $base)"
  docker build -q -f "$dockerfile" --build-arg BASE_IMAGE="$base" --build-arg PIP_NO_INDEX=1 \
    --build-arg PIP_FIND_LINKS="$WHEEL_URL" --build-arg PIP_TRUSTED_HOST="${WHEEL_URL#http://}" \
    --label hotset.inputs="$key" -t "$image" . >/dev/null
  docker image prune -f --filter label=hotset.inputs >/dev/null
  drop_wheels "$wheels"
  size=$(docker image inspect -f '{{.Size}}' "$image")
  echo "build-images: $image built in $((SECONDS - start)) s, $((size / 1000000)) MB"
}

wants operator operator,router "setuptools>=68" wheel
wants worker worker "setuptools>=68" wheel
wants triton-cpu "" nvidia-pytriton==0.7.0
if [ $WHEELS_ONLY = 1 ]; then
  for set in operator worker triton-cpu; do wheels "$set"; done
  exit 0
fi

trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; true' EXIT
build "hotset-operator:$TAG" Dockerfile.operator "$PYTHON_BASE" operator
build "hotset-triton-cpu:$TAG" Dockerfile.triton-cpu "$DEBIAN_BASE" triton-cpu
build "hotset-worker:$TAG" Dockerfile.worker "$PYTHON_BASE" worker

# The tier's S3 server and OCI registry: binaries scripts/install-s3.sh and install-registry.sh
# built, each alone FROM scratch (no wheels, no base).
static_image() {  # static_image IMAGE DOCKERFILE BINARY [FILE...]: the files go into the build context
  local image=$1 dockerfile=$2 binary=$3 start=$SECONDS context key; shift 3
  [ -x "$binary" ] || { echo "build-images: $binary is missing (scripts/install-s3.sh, scripts/install-registry.sh)" >&2; exit 1; }
  key=$( { cat "$dockerfile"; sha1sum "$binary"; } | sha1sum | cut -c1-12)
  if [ "$(docker image inspect -f '{{ index .Config.Labels "hotset.inputs" }}' "$image" 2>/dev/null)" = "$key" ]; then
    echo "build-images: $image is up to date"
    return 0
  fi
  context=$(mktemp -d)
  cp "$binary" "$context/" && cp "$dockerfile" "$context/Dockerfile"
  printf '%s\n' "$@" > "$context/config.yml"
  docker build -q --label hotset.inputs="$key" -t "$image" "$context" >/dev/null
  rm -rf "$context"
  echo "build-images: $image built in $((SECONDS - start)) s"
}
static_image "hotset-s3:$TAG" Dockerfile.s3 "$(ls -d "$CACHE"/tools/minio-*/minio 2>/dev/null | head -1)"
static_image "hotset-registry:$TAG" Dockerfile.registry "$(ls -d "$CACHE"/tools/registry-*/registry 2>/dev/null | head -1)" \
  "version: 0.1" "storage: {filesystem: {rootdirectory: /var/lib/registry}, delete: {enabled: true}}" \
  "http: {addr: ':5000'}" "log: {level: warn}"
