#!/usr/bin/env bash
# Builds a real Kubernetes control plane (kube-apiserver, kube-controller-manager,
# kube-scheduler) and helm from the Go module proxy, once per machine.
# `install-k8s.sh --node` also builds the node binaries (kubelet, kubeadm, kubectl,
# kube-proxy) from the same wrapper module, for the kind tier's node image.
# No registry ships these binaries, so we compile them; the outputs are cached
# outside the repository keyed by version and never committed.
set -euo pipefail
. "$(dirname "$0")/go-env.sh"  # the project's own Go caches, freed by drop-go-caches.sh

K8S_VERSION="${K8S_VERSION:-v1.36.3}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"
BIN="$CACHE/k8s-$K8S_VERSION/bin"
BUILD="$CACHE/k8s-build-$K8S_VERSION"
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler)
NODE_COMPONENTS=(kubelet kubeadm kubectl kube-proxy)
[ "${1:-}" = "--node" ] && COMPONENTS+=("${NODE_COMPONENTS[@]}")

mkdir -p "$BIN" "$BUILD"
command -v go >/dev/null || { echo "install-k8s: needs the Go toolchain (go >= 1.26) on PATH" >&2; exit 1; }

missing=()
for c in "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || missing+=("$c"); done

if [ ${#missing[@]} -gt 0 ]; then
  echo "install-k8s: building ${missing[*]} $K8S_VERSION (cold build on 2 cores: control plane and helm 9.5 min, node binaries 1.5 min, measured on a new machine)"
  cd "$BUILD"
  staging_version="v0.${K8S_VERSION#v1.}"
  gomod_path=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
  {
    echo "module hotset.local/k8sbuild"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # Staging modules are replaced by ./staging/... in kubernetes' own go.mod, which
    # a dependent module ignores: point each at its published version instead.
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$gomod_path" \
      | awk -v v="$staging_version" '{print "replace " $1 " => " $1 " " v}'
  } > go.mod
  cat > tools.go <<'GO'
//go:build tools

package k8sbuild

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver/app"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	_ "k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "k8s.io/kubernetes/cmd/kubeadm/app"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
	_ "k8s.io/kubernetes/cmd/kube-proxy/app"
	_ "k8s.io/kubectl/pkg/cmd"
)
GO
  GOFLAGS=-mod=mod go mod tidy -e >/dev/null 2>&1 || true
  GOFLAGS=-mod=mod go mod download
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=${K8S_VERSION#v1.}"
  ldflags="${ldflags%.*}"
  for c in "${missing[@]}"; do
    echo "install-k8s: go build $c"
    GOFLAGS=-mod=mod go build -trimpath -ldflags "$ldflags" -o "$BIN/$c" "k8s.io/kubernetes/cmd/$c"
  done
fi

if [ ! -x "$BIN/helm" ]; then
  echo "install-k8s: building helm $HELM_VERSION"
  GOBIN="$BIN" go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
fi

echo "install-k8s: binaries in $BIN"
ls -la "$BIN"
