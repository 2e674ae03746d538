# Versions of what the kind tier builds (sourced by install-kind.sh and
# kind-node-image.sh, so the two always agree); each can be overridden from the
# environment. Binaries are cached under ~/.cache/hotset/tools/<name>-<version>.
K8S_VERSION="${K8S_VERSION:-v1.36.3}"
KIND_VERSION="${KIND_VERSION:-v0.33.0}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.4.2}"
CRICTL_VERSION="${CRICTL_VERSION:-v1.37.0}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.8}"
COREDNS_VERSION="${COREDNS_VERSION:-v1.14.2}"
KUBE_ROUTER_VERSION="${KUBE_ROUTER_VERSION:-v2.1.0}"
PAUSE_VERSION=3.10.2
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"
TOOLS="$CACHE/tools"
