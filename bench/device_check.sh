#!/usr/bin/env bash
# The CUDA checks, for a machine with an NVIDIA GPU: assemble every zoo model's PTX, run it on GPU 0
# against the reference interpreter (kernel by kernel and as a CUDA graph), and time it against
# PyTorch CUDA eager. Uses the machine's python3 (which must have numpy, llvmlite, onnx, z3-solver,
# cuda-bindings, torch and onnxruntime; missing ones can be installed from wheels in .whl/).
set -euo pipefail
cd "$(dirname "$0")/.."
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH="/tmp/site:${PYTHONPATH:-}"
fi
export PYTHONPATH=".:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
python3 -m bench.cuda_check "$@"
