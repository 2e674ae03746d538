#!/usr/bin/env bash
# Local stand-ins for registry base images, made from Debian packages with
# debootstrap, for machines where no container registry answers:
#   hotset-base/python:bookworm  Debian's python3.11 (+ venv, libpython, numpy): BASE_IMAGE of
#                                    Dockerfile.worker/.operator/.triton-cpu here
#                                    (users keep the official python:3.11-slim)
#   hotset-base/node:bookworm    systemd, iptables, runc, CNI plugins...: the
#                                    kind node image's base and the control-plane
#                                    component images' base (e2e/kind/node/)
# Each is made once (about a minute) and kept by the Docker engine; the package
# list is part of the tag's label, so a changed list remakes it. Needs root, a
# running Docker engine and the Debian mirror apt uses.
set -euo pipefail

SUITE=bookworm
MIRROR="${DEBIAN_MIRROR:-$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"

PYTHON_PACKAGES=python3,python3.11,libpython3.11,python3-venv,python3.11-venv,python3-numpy,ca-certificates,netbase,tzdata
NODE_PACKAGES=systemd,systemd-sysv,dbus,conntrack,iptables,nftables,ipset,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,bash,ca-certificates,jq,procps,runc,containernetworking-plugins,e2fsprogs,socat

command -v debootstrap >/dev/null || { echo "base-images: needs debootstrap (scripts/install-docker.sh)" >&2; exit 1; }

# make_base TAG PACKAGES: debootstrap a minbase rootfs with PACKAGES and `docker import` it.
make_base() {
  local tag=$1 packages=$2
  local key; key=$(echo "$SUITE $packages" | sha1sum | cut -c1-12)
  if [ "$(docker image inspect -f '{{ index .Config.Labels "hotset.packages" }}' "$tag" 2>/dev/null)" = "$key" ]; then
    return 0
  fi
  local start=$SECONDS rootfs
  rootfs=$(mktemp -d "${TMPDIR:-/tmp}/hotset-rootfs.XXXXXX")
  trap 'rm -rf "$rootfs"' RETURN
  echo "base-images: debootstrap $tag ($packages)"
  mkdir -p "$CACHE/debootstrap-cache"
  debootstrap --variant=minbase --include="$packages" --cache-dir="$CACHE/debootstrap-cache" \
    "$SUITE" "$rootfs" "$MIRROR" > "$rootfs.log" 2>&1 || { tail -n 30 "$rootfs.log" >&2; exit 1; }
  rm -f "$rootfs.log"
  # What a registry's image would not carry: apt lists and caches, the host's resolv.conf.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
  : > "$rootfs/etc/resolv.conf"
  tar -C "$rootfs" -c . | docker import \
    --change "LABEL hotset.packages=$key" --change 'CMD ["/bin/bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$tag" >/dev/null
  echo "base-images: $tag made in $((SECONDS - start)) s"
}

make_base hotset-base/python:$SUITE "$PYTHON_PACKAGES"
make_base hotset-base/node:$SUITE "$NODE_PACKAGES"
