#!/usr/bin/env bash
# Makes the tritonserver binary from the nvidia-pytriton wheel runnable on CPU.
# The Python backend's stub embeds Debian's libpython3.11, so Triton-side models
# run in a venv of Debian's Python (numpy only), never in pyenv's (see
# ../shared/notes/environment.md: mixing them breaks the stub).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

wheel_root="$(.venv/bin/python -c 'import pytriton, pathlib; print(pathlib.Path(pytriton.__file__).parent)')"
backend_dir="$wheel_root/tritonserver/backends/python"
stub="$wheel_root/tritonserver/python_backend_stubs/3.11/triton_python_backend_stub"
if [ ! -x "$backend_dir/triton_python_backend_stub" ]; then
  cp "$stub" "$backend_dir/triton_python_backend_stub"
fi

if [ ! -x build/triton-venv/bin/python ]; then
  mkdir -p build
  /usr/bin/python3.11 -m venv build/triton-venv
fi
if ! build/triton-venv/bin/python -c 'import numpy' 2>/dev/null; then
  build/triton-venv/bin/pip install -q 'numpy<2'
fi
echo "install-triton: tritonserver at $wheel_root/tritonserver/bin/tritonserver"
