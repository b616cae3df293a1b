#!/usr/bin/env bash
# A bounded schemathesis run over the server's OpenAPI document: fails on any 5xx response.
# Runs `minedraft serve` on the bundled model with a short context (40 tokens), so every request is quick.
# Usage: bash scripts/fuzz_server.sh [MAX_EXAMPLES]   (schemathesis lives in its own .venv-fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
examples=${1:-25}
port=${PORT:-8123}
[ -x .venv-fuzz/bin/schemathesis ] || { python3 -m venv .venv-fuzz && .venv-fuzz/bin/pip install -q schemathesis==4.32.5; }
.venv/bin/minedraft serve --port "$port" --max-model-len 40 --max-num-seqs 8 --served-model-name smollm2 &
server=$!
trap 'kill $server' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
.venv-fuzz/bin/schemathesis run "http://127.0.0.1:$port/openapi.json" --checks not_a_server_error \
    --max-examples "$examples" --request-timeout 120
