#!/usr/bin/env bash
# Builds modelplane's three images with a running Docker engine:
#   modelplane-operator:$TAG  (Dockerfile.operator; the router runs from it too)
#   modelplane-worker:$TAG    (Dockerfile.worker)
#   modelplane-triton-cpu:$TAG (Dockerfile.triton-cpu: the CPU Triton sidecar)
# Wheels come from pip's cache: each image's requirement set is downloaded once per
# machine into ~/.cache/modelplane/wheels/<pyproject hash>/<image> (pip reads its
# HTTP cache; only index pages go out) and served to the build over the Docker
# bridge (this machine only) as PIP_FIND_LINKS with PIP_NO_INDEX=1. Where no registry
# answers (MODELPLANE_LOCAL_BASE=1, the default on machines without CAP_SYS_RESOURCE)
# the base is scripts/base-images.sh's modelplane-base/python; elsewhere the official
# python:3.11-slim and debian:bookworm-slim. Prints each build's time and size.
#   scripts/build-images.sh [TAG] (default e2e)
#   scripts/build-images.sh --wheels-only   (gather the wheels, build nothing)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WHEELS_ONLY=0
[ "${1:-}" = "--wheels-only" ] && { WHEELS_ONLY=1; shift; }
TAG="${1:-e2e}"
CACHE="${MODELPLANE_CACHE:-$HOME/.cache/modelplane}"
PIP=.venv/bin/pip
PYTHON=.venv/bin/python

if [ $WHEELS_ONLY = 1 ]; then :
elif [ -z "${MODELPLANE_LOCAL_BASE:-}" ]; then
  # CAP_SYS_RESOURCE is bit 24 of the bounding set: without it this is a machine of the
  # project's workplace, where no registry answers.
  if (( (16#$(awk '/^CapBnd/ {print $2}' /proc/self/status) >> 24) & 1 )); then MODELPLANE_LOCAL_BASE=0; else MODELPLANE_LOCAL_BASE=1; fi
fi
if [ $WHEELS_ONLY = 1 ]; then :
elif [ "$MODELPLANE_LOCAL_BASE" = 1 ]; then
  scripts/base-images.sh
  PYTHON_BASE=modelplane-base/python:bookworm
  DEBIAN_BASE=modelplane-base/python:bookworm
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

# wheels NAME EXTRAS [EXTRA_REQUIREMENT...]: the wheel set of one image, downloaded once.
wheels() {
  local name=$1 extras=$2; shift 2
  local dir="$WHEELS/$name"
  [ -f "$dir/.complete" ] && return 0
  mkdir -p "$dir"
  local reqs="$dir/requirements.txt"
  { if [ -n "$extras" ]; then requirements "$extras"; fi; printf '%s\n' "$@"; } > "$reqs"
  echo "build-images: gathering $name wheels (from pip's cache)"
  "$PIP" download -q --only-binary=:all: -d "$dir" -r "$reqs"
  touch "$dir/.complete"
}

# serve NAME: an HTTP server for one image's wheels on the Docker bridge's gateway address,
# reachable from build containers on this machine only; sets WHEEL_URL, stopped by pid on exit.
SERVER_PID=""
serve() {  # serve NAME KEY
  local key=$2
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  local gateway port
  gateway=$(docker network inspect bridge -f '{{(index .IPAM.Config 0).Gateway}}')
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
           ls "$WHEELS/$wheels"; } | sha1sum | cut -c1-12)
  if [ "$(docker image inspect -f '{{ index .Config.Labels "modelplane.inputs" }}' "$image" 2>/dev/null)" = "$key" ]; then
    echo "build-images: $image is up to date"
    return 0
  fi
  serve "$wheels" "$(echo "$wheels $WHEELS" | sha1sum | cut -c1-8)"
  echo "build-images: building $image from $dockerfile (base $base)"
  docker build -q -f "$dockerfile" --build-arg BASE_IMAGE="$base" --build-arg PIP_NO_INDEX=1 \
    --build-arg PIP_FIND_LINKS="$WHEEL_URL" --build-arg PIP_TRUSTED_HOST="${WHEEL_URL#http://}" \
    --label modelplane.inputs="$key" -t "$image" . >/dev/null
  docker image prune -f --filter label=modelplane.inputs >/dev/null
  size=$(docker image inspect -f '{{.Size}}' "$image")
  echo "build-images: $image built in $((SECONDS - start)) s, $((size / 1000000)) MB"
}

wheels operator operator,router "setuptools>=68" wheel
wheels worker worker "setuptools>=68" wheel
wheels triton-cpu "" nvidia-pytriton==0.7.0
[ $WHEELS_ONLY = 1 ] && exit 0

trap '[ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; true' EXIT
build "modelplane-operator:$TAG" Dockerfile.operator "$PYTHON_BASE" operator
build "modelplane-triton-cpu:$TAG" Dockerfile.triton-cpu "$DEBIAN_BASE" triton-cpu
build "modelplane-worker:$TAG" Dockerfile.worker "$PYTHON_BASE" worker
