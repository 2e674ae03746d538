#!/usr/bin/env bash
# Builds what the kind tier needs besides the Kubernetes binaries, once per
# machine, from the Go module proxy: kind itself, and for the locally built node
# image (machines where no container registry answers) containerd 2.x, crictl,
# etcd, a CoreDNS without the forward plugin, kube-router (pod routes and
# NetworkPolicy), the pause program and hotset-runc (the CAP_SYS_RESOURCE
# shim, see docs/e2e.md). Outputs are cached under ~/.cache/hotset keyed by
# version and never committed. The node's kubelet, kubeadm, kubectl and
# kube-proxy come from `scripts/install-k8s.sh --node`.
set -euo pipefail
. "$(dirname "$0")/go-env.sh"  # the project's own Go caches, freed by drop-go-caches.sh
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NODE_SRC="$ROOT/e2e/kind/node"

. "$ROOT/scripts/kind-versions.sh"
command -v go >/dev/null || { echo "install-kind: needs the Go toolchain (go >= 1.26) on PATH" >&2; exit 1; }

step() { echo "install-kind: $*"; }

# go_install DIR VERSION PACKAGE... [-- ENV=VALUE ...]: `go install` into DIR unless its binaries exist.
go_install() {
  local dir=$1 version=$2; shift 2
  local packages=() envs=()
  while [ $# -gt 0 ]; do
    if [ "$1" = "--" ]; then shift; envs=("$@"); break; fi
    packages+=("$1@$version"); shift
  done
  local missing=0
  for p in "${packages[@]}"; do
    local name="${p%@*}"; [ -x "$dir/${name##*/}" ] || missing=1
  done
  [ $missing = 1 ] || return 0
  mkdir -p "$dir"
  local start=$SECONDS
  step "go install ${packages[*]}"
  env GOBIN="$dir" "${envs[@]}" go install -trimpath -ldflags "-s -w" "${packages[@]}"
  step "built in $((SECONDS - start)) s"  # docs/e2e.md quotes these
}

# wrapper_build DIR NAME SRC_DIR MODULE VERSION [ENV=VALUE ...]: build a one-file
# main (SRC_DIR/main.go) against MODULE@VERSION in a module made in the cache.
wrapper_build() {
  local dir=$1 name=$2 src=$3 module=$4 version=$5; shift 5
  [ -x "$dir/$name" ] && return 0
  local build="$dir/src"
  mkdir -p "$build"
  cp "$src/main.go" "$build/main.go"
  printf 'module hotset.local/%s\n\ngo 1.26\n\nrequire %s %s\n' "$name" "$module" "$version" > "$build/go.mod"
  local start=$SECONDS
  step "go build $name ($module $version)"
  (cd "$build" && GOFLAGS=-mod=mod go mod tidy >/dev/null \
    && env "$@" go build -trimpath -ldflags "-s -w" -o "$dir/$name" .)
  step "built in $((SECONDS - start)) s"
}

go_install "$TOOLS/kind-$KIND_VERSION" "$KIND_VERSION" sigs.k8s.io/kind -- CGO_ENABLED=0
go_install "$TOOLS/containerd-$CONTAINERD_VERSION" "$CONTAINERD_VERSION" \
  github.com/containerd/containerd/v2/cmd/containerd \
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
  github.com/containerd/containerd/v2/cmd/ctr -- CGO_ENABLED=0 "GOFLAGS=-buildvcs=false -tags=no_btrfs,no_devmapper,no_zfs,no_aufs"
go_install "$TOOLS/crictl-$CRICTL_VERSION" "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl -- CGO_ENABLED=0
go_install "$TOOLS/kube-router-$KUBE_ROUTER_VERSION" "$KUBE_ROUTER_VERSION" \
  github.com/cloudnativelabs/kube-router/v2/cmd/kube-router -- CGO_ENABLED=0
wrapper_build "$TOOLS/etcd-$ETCD_VERSION" etcd "$NODE_SRC/etcd" go.etcd.io/etcd/server/v3 "$ETCD_VERSION" CGO_ENABLED=0
wrapper_build "$TOOLS/coredns-$COREDNS_VERSION" coredns "$NODE_SRC/coredns" github.com/coredns/coredns "$COREDNS_VERSION" CGO_ENABLED=0

# Our own small programs: rebuilt when their source changes (keyed by its hash).
shim_hash=$(cat "$NODE_SRC/runc-shim/main.go" "$NODE_SRC/runc-shim/go.mod" | sha1sum | cut -c1-12)
shim_dir="$TOOLS/hotset-runc-$shim_hash"
if [ ! -x "$shim_dir/hotset-runc" ]; then
  mkdir -p "$shim_dir"
  (cd "$NODE_SRC/runc-shim" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$shim_dir/hotset-runc" .)
fi
ln -sfn "$shim_dir" "$TOOLS/hotset-runc"
pause_hash=$(sha1sum < "$NODE_SRC/pause/pause.c" | cut -c1-12)
pause_dir="$TOOLS/pause-$pause_hash"
if [ ! -x "$pause_dir/pause" ]; then
  mkdir -p "$pause_dir"
  gcc -Os -static -Wall -o "$pause_dir/pause" "$NODE_SRC/pause/pause.c"
  strip "$pause_dir/pause"
fi
ln -sfn "$pause_dir" "$TOOLS/pause"

step "tools in $TOOLS"
