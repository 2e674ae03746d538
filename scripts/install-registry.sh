#!/usr/bin/env bash
# Builds the CNCF distribution registry from the Go module proxy, once per machine, for the kind
# tier's oci:// scenario (a model image pushed to it, served through an image volume). Cached
# under ~/.cache/hotset/tools/registry-<version>/, never committed.
set -euo pipefail
. "$(dirname "$0")/go-env.sh"  # the project's own Go caches, freed by drop-go-caches.sh

REGISTRY_VERSION="${REGISTRY_VERSION:-v3.1.2}"
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"
BIN="$CACHE/tools/registry-$REGISTRY_VERSION"

if [ -x "$BIN/registry" ]; then
  echo "install-registry: registry in $BIN"
  exit 0
fi
command -v go >/dev/null || { echo "install-registry: needs the Go toolchain on PATH" >&2; exit 1; }
echo "install-registry: building the distribution registry $REGISTRY_VERSION"
mkdir -p "$BIN.partial"
started=$(date +%s)
CGO_ENABLED=0 GOBIN="$BIN.partial" GOFLAGS=-mod=mod \
  go install -trimpath -ldflags "-s -w" "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
rm -rf "$BIN" && mv "$BIN.partial" "$BIN"
echo "install-registry: registry built in $(( $(date +%s) - started ))s, in $BIN"
