#!/usr/bin/env bash
# Fetches the Gateway API Inference Extension's CRDs (InferencePool) from the Go module proxy, once
# per machine, for the tests of the operator's InferencePool option (tests/operator/
# test_inference_pools.py). A cluster that routes with the extension installs these itself; hotset's
# chart does not ship them. Cached outside the repository under
# ~/.cache/hotset/tools/inference-extension-<version>/ and never committed.
set -euo pipefail
. "$(dirname "$0")/go-env.sh"  # the project's own Go caches, freed by drop-go-caches.sh

INFERENCE_EXTENSION_VERSION="${INFERENCE_EXTENSION_VERSION:-v1.6.2}"
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"
DIR="$CACHE/tools/inference-extension-$INFERENCE_EXTENSION_VERSION"
MODULE="sigs.k8s.io/gateway-api-inference-extension"

if [ -s "$DIR/inferencepools.yaml" ]; then
  echo "install-inference-crds: $DIR"
  exit 0
fi
command -v go >/dev/null || { echo "install-inference-crds: needs the Go toolchain on PATH" >&2; exit 1; }
module_dir=$(GOFLAGS=-mod=mod go mod download -json "$MODULE@$INFERENCE_EXTENSION_VERSION" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')
mkdir -p "$DIR.partial"
cp "$module_dir/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$DIR.partial/inferencepools.yaml"
rm -rf "$DIR" && mv "$DIR.partial" "$DIR"
echo "install-inference-crds: InferencePool CRD of $MODULE $INFERENCE_EXTENSION_VERSION in $DIR"
