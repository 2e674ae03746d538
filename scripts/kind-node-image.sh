#!/usr/bin/env bash
# Builds the kind node image for machines where no registry answers (test
# infrastructure; see docs/e2e.md): the control-plane component images, pause,
# CoreDNS and kube-router images (hotset.local/*), then
# hotset.local/kind-node:$K8S_VERSION-<inputs hash> from e2e/kind/node/Dockerfile,
# and prints that tag last. Skips every image whose inputs did not change.
# Needs a running Docker engine, scripts/base-images.sh's node base,
# `scripts/install-k8s.sh --node` and scripts/install-kind.sh.
set -euo pipefail
. "$(dirname "$0")/go-env.sh"  # the project's own Go caches
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NODE_SRC="$ROOT/e2e/kind/node"
. "$ROOT/scripts/kind-versions.sh"
K8S_BIN="$CACHE/k8s-$K8S_VERSION/bin"
NODE_BASE=hotset-base/node:bookworm
REPO=hotset.local

say() { echo "kind-node-image: $*" >&2; }
exists() { docker image inspect "$1" >/dev/null 2>&1; }

# component IMAGE BINARY [FROM]: an image holding one binary as its entry point.
component() {
  local image=$1 binary=$2 from=${3:-$NODE_BASE} name key ctx
  name=$(basename "$binary")
  key=$(cat "$binary" <(docker image inspect -f '{{.Id}}' "$from" 2>/dev/null || echo scratch) | sha1sum | cut -c1-12)
  if [ "$(docker image inspect -f '{{ index .Config.Labels "hotset.inputs" }}' "$image" 2>/dev/null)" = "$key" ]; then
    return 0
  fi
  ctx=$(mktemp -d)
  cp "$binary" "$ctx/$name"
  printf 'FROM %s\nCOPY %s /usr/local/bin/%s\nLABEL hotset.inputs=%s\nENTRYPOINT ["/usr/local/bin/%s"]\n' \
    "$from" "$name" "$name" "$key" "$name" > "$ctx/Dockerfile"
  docker build -q -t "$image" "$ctx" >/dev/null
  rm -rf "$ctx"
  say "built $image"
}

for b in "$K8S_BIN"/{kubelet,kubeadm,kubectl,kube-proxy,kube-apiserver,kube-controller-manager,kube-scheduler}; do
  [ -x "$b" ] || { echo "kind-node-image: $b missing: run scripts/install-k8s.sh --node" >&2; exit 1; }
done
exists "$NODE_BASE" || { echo "kind-node-image: $NODE_BASE missing: run scripts/base-images.sh" >&2; exit 1; }

start=$SECONDS
for c in kube-apiserver kube-controller-manager kube-scheduler kube-proxy; do
  component "$REPO/$c:$K8S_VERSION" "$K8S_BIN/$c"
done
component "$REPO/etcd:${ETCD_VERSION#v}-0" "$TOOLS/etcd-$ETCD_VERSION/etcd"
component "$REPO/coredns:$COREDNS_VERSION" "$TOOLS/coredns-$COREDNS_VERSION/coredns"
component "$REPO/kube-router:$KUBE_ROUTER_VERSION" "$TOOLS/kube-router-$KUBE_ROUTER_VERSION/kube-router"
component "$REPO/pause:$PAUSE_VERSION" "$TOOLS/pause/pause" scratch
IMAGES=("$REPO/kube-apiserver:$K8S_VERSION" "$REPO/kube-controller-manager:$K8S_VERSION"
        "$REPO/kube-scheduler:$K8S_VERSION" "$REPO/kube-proxy:$K8S_VERSION" "$REPO/etcd:${ETCD_VERSION#v}-0"
        "$REPO/coredns:$COREDNS_VERSION" "$REPO/kube-router:$KUBE_ROUTER_VERSION" "$REPO/pause:$PAUSE_VERSION")

# The node image's tag carries a hash of everything that goes into it.
kind_files=$(cd "$ROOT" && go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')/images/base/files
binaries=("$TOOLS/containerd-$CONTAINERD_VERSION"/{containerd,containerd-shim-runc-v2,ctr} "$TOOLS/crictl-$CRICTL_VERSION/crictl"
          "$TOOLS/hotset-runc/hotset-runc" "$K8S_BIN"/{kubelet,kubeadm,kubectl})
key=$( { docker image inspect -f '{{.Id}}' "$NODE_BASE" "${IMAGES[@]}"; cat "${binaries[@]}" "$NODE_SRC/Dockerfile";
         (cd "$NODE_SRC/files" && find . -type f | sort | xargs cat); } | sha1sum | cut -c1-12)
NODE_IMAGE="$REPO/kind-node:$K8S_VERSION-$key"
if ! exists "$NODE_IMAGE"; then
  ctx=$(mktemp -d)
  trap 'rm -rf "$ctx"' EXIT
  mkdir -p "$ctx/kind" "$ctx/bin" "$ctx/k8s"
  cp -r "$kind_files" "$ctx/kind/files" && chmod -R u+w "$ctx/kind"
  cp -r "$NODE_SRC/files" "$ctx/node"
  cp "${binaries[@]:0:5}" "$ctx/bin/"
  cp "$K8S_BIN"/{kubelet,kubeadm,kubectl} "$ctx/k8s/"
  cp "$NODE_SRC/Dockerfile" "$ctx/Dockerfile"
  docker save "${IMAGES[@]}" -o "$ctx/images.tar"
  say "building $NODE_IMAGE"
  docker build -q --build-arg NODE_BASE="$NODE_BASE" --build-arg K8S_VERSION="$K8S_VERSION" -t "$NODE_IMAGE" "$ctx" >/dev/null
  size=$(docker image inspect -f '{{.Size}}' "$NODE_IMAGE")
  say "$NODE_IMAGE built in $((SECONDS - start)) s, $((size / 1000000)) MB"
fi
echo "$NODE_IMAGE"
