#!/usr/bin/env bash
# Builds one Go command from the Go module proxy, once per machine, into
# ~/.cache/hotset/tools/<name>-<version>/ (never committed), and prints its path.
# Usage: scripts/install-go-tool.sh NAME MODULE_PATH VERSION
#   e.g. scripts/install-go-tool.sh vegeta github.com/tsenart/vegeta/v12 v12.13.0
set -euo pipefail
. "$(dirname "$0")/go-env.sh"  # the project's own Go caches, freed by drop-go-caches.sh

NAME="$1" MODULE="$2" VERSION="$3"
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"
BIN="$CACHE/tools/$NAME-$VERSION"

if [ ! -x "$BIN/$NAME" ]; then
  command -v go >/dev/null || { echo "install-go-tool: needs the Go toolchain on PATH" >&2; exit 1; }
  echo "install-go-tool: building $NAME $VERSION" >&2
  mkdir -p "$BIN.partial"
  CGO_ENABLED=0 GOBIN="$BIN.partial" GOFLAGS=-mod=mod go install -trimpath -ldflags "-s -w" "$MODULE@$VERSION" >&2
  rm -rf "$BIN" && mv "$BIN.partial" "$BIN"
fi
echo "$BIN/$NAME"
