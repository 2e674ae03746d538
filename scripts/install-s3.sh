#!/usr/bin/env bash
# Builds a real S3 server (MinIO) from the Go module proxy, once per machine, for the tests of
# s3:// and gs:// model sources (tests/worker/test_sources_*.py) and the kind tier's in-cluster
# S3 server. MinIO publishes no tagged module versions, so a pseudo-version is pinned; the binary
# is cached outside the repository under ~/.cache/hotset/tools/minio-<version>/ and never committed.
set -euo pipefail
. "$(dirname "$0")/go-env.sh"  # the project's own Go caches, freed by drop-go-caches.sh

MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"
BIN="$CACHE/tools/minio-$MINIO_VERSION"

if [ -x "$BIN/minio" ]; then
  echo "install-s3: minio in $BIN"
  exit 0
fi
command -v go >/dev/null || { echo "install-s3: needs the Go toolchain (go >= 1.24) on PATH" >&2; exit 1; }
echo "install-s3: building minio $MINIO_VERSION (cold build: a few minutes on 2 cores)"
mkdir -p "$BIN.partial"
started=$(date +%s)
# Static, stripped, no cgo: the same binary serves the tests and a FROM-scratch image.
CGO_ENABLED=0 GOBIN="$BIN.partial" GOFLAGS=-mod=mod \
  go install -trimpath -ldflags "-s -w" "github.com/minio/minio@$MINIO_VERSION"
rm -rf "$BIN" && mv "$BIN.partial" "$BIN"
echo "install-s3: minio built in $(( $(date +%s) - started ))s, in $BIN"
