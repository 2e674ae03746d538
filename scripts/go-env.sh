# Sourced by every script that compiles Go: the project's own Go caches.
# Compiling Kubernetes, containerd, MinIO and the rest fills a build cache and a
# module cache of about 12 GB (7.3 + 4.8 GB measured on a new machine), while the
# binaries themselves (~1.5 GB) are what the project keeps, by version, under
# ~/.cache/hotset. Keeping those caches here, not in the user's ~/.cache/go-build
# and ~/go, lets scripts/drop-go-caches.sh free them once every binary is built
# without touching anyone else's Go caches. HOTSET_GOCACHE / HOTSET_GOMODCACHE
# point elsewhere (a developer's own caches, say).
_hotset_cache="${HOTSET_CACHE:-$HOME/.cache/hotset}"
export GOCACHE="${HOTSET_GOCACHE:-$_hotset_cache/go/build}"
export GOMODCACHE="${HOTSET_GOMODCACHE:-$_hotset_cache/go/mod}"
unset _hotset_cache
