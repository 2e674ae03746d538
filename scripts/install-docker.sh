#!/usr/bin/env bash
# What the kind tier needs from Debian: a Docker engine (docker.io: dockerd, its
# containerd and runc) where none answers, and debootstrap for the local base
# images (scripts/base-images.sh). Idempotent; installs only what is missing and
# only as root with apt-get. The engine itself is started by the tier when none
# answers (e2e/kind/engine.py) and stopped by pid when it ends.
set -euo pipefail

need=()
if ! docker info >/dev/null 2>&1 && ! command -v dockerd >/dev/null; then need+=(docker.io); fi
command -v debootstrap >/dev/null || need+=(debootstrap)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
  echo "install-docker: missing ${need[*]}; install them (Debian: apt-get install ${need[*]}) or the kind tier skips" >&2
  exit 0
fi
echo "install-docker: apt-get install ${need[*]}"
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
