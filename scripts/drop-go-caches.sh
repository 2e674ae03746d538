#!/usr/bin/env bash
# Frees the project's Go build and module caches (scripts/go-env.sh) once the
# installs have built every binary: about 12 GB that the kind tier's images and
# nodes need more (docs/e2e.md, "Disk"). A later build of a new version fetches
# its modules again from the Go module proxy. HOTSET_KEEP_GO_CACHES=1 keeps them
# (a developer bumping versions often), and caches pointed elsewhere with
# HOTSET_GOCACHE / HOTSET_GOMODCACHE are never touched.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
[ "${HOTSET_KEEP_GO_CACHES:-0}" = 1 ] && exit 0
[ -z "${HOTSET_GOCACHE:-}${HOTSET_GOMODCACHE:-}" ] || exit 0
. "$ROOT/scripts/go-env.sh"
[ -d "$GOCACHE" ] || [ -d "$GOMODCACHE" ] || exit 0
freed=0
for dir in "$GOCACHE" "$GOMODCACHE"; do
  [ -d "$dir" ] && freed=$((freed + $(du -sm "$dir" | cut -f1)))
done
# The module cache is read-only by design; `go clean -modcache` knows how to remove it.
if [ -d "$GOMODCACHE" ]; then
  if command -v go >/dev/null; then go clean -modcache; fi
  chmod -R u+w "$GOMODCACHE" 2>/dev/null || true
  rm -rf "$GOMODCACHE"
fi
rm -rf "$GOCACHE"
echo "drop-go-caches: freed ${freed} MB of Go build and module caches (binaries stay in ${GOCACHE%/go/build})"
