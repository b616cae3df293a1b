#!/usr/bin/env bash
# Issue 19's serving matrix: for each mode (ar, sd, psd) and each server variant, start
# `minedraft serve` on core 0 (one torch thread; psd's drafter on core 1), drive it with
# `bench serve` (Poisson arrivals of Spec-Bench chats) at each rate, then stop it.
#
#   bash scripts/serve_sweep.sh OUT_DIR "VARIANT=SERVE_FLAGS" ["VARIANT=SERVE_FLAGS" ...]
#   e.g. bash scripts/serve_sweep.sh /tmp/sweep "paced=" "unpaced=--prefill-stall-ratio none"
#
# Environment: MODES (default "ar sd psd"; also psd-auto, and psd-pod: prefill_on_drafter), RATES (default "0.25 0.5 1.0"), NUM_PROMPTS (16),
# OUTPUT_LEN (64), K (2), PORT (8031), PYTHON (.venv/bin/python). One JSON per cell in OUT_DIR;
# `python scripts/serve_table.py OUT_DIR` prints the table. Variants of one mode run back to back,
# so a comparison is side by side. PYTHON_<VARIANT> runs that variant's server with another
# interpreter (e.g. the .venv of a worktree of main made by its scripts/install.sh), ENV_<VARIANT>
# with extra environment variables (e.g. ENV_eager="MINEDRAFT_SMALL_GEMM=0").
set -euo pipefail
cd "$(dirname "$0")/.."
out=$1; shift
mkdir -p "$out"
py=${PYTHON:-.venv/bin/python}
port=${PORT:-8031}
k=${K:-2}
data=../shared/data/spec_bench_questions.jsonl
for mode in ${MODES:-ar sd psd}; do
  case $mode in
    ar) spec=() ;;
    sd) spec=(--speculative-config "{\"num_speculative_tokens\": $k}") ;;
    psd) spec=(--speculative-config "{\"num_speculative_tokens\": $k, \"parallel\": true}") ;;
    psd-auto) spec=(--speculative-config "{\"num_speculative_tokens\": $k, \"parallel\": true, \"overlap\": \"auto\"}") ;;
    psd-pod) spec=(--speculative-config "{\"num_speculative_tokens\": $k, \"parallel\": true, \"prefill_on_drafter\": true}") ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
  for variant in "$@"; do
    name=${variant%%=*}; flags=${variant#*=}
    if curl -sf "http://127.0.0.1:$port/health" > /dev/null; then
      echo "port $port already serves: stop that server (or set PORT)" >&2; exit 1
    fi
    py_var=PYTHON_$name env_var=ENV_$name
    # shellcheck disable=SC2086  # the variant's flags and environment are words
    env ${!env_var:-} taskset -c 0 "${!py_var:-$py}" -m minedraft.cli serve --port "$port" --max-num-seqs 16 --num-threads 1 \
      "${spec[@]}" $flags > "$out/server_${mode}_${name}.log" 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$port/health" > /dev/null; do
      kill -0 $server 2> /dev/null || { echo "server $mode $name died, see $out/server_${mode}_${name}.log" >&2; exit 1; }
      sleep 2
    done
    for rate in ${RATES:-0.25 0.5 1.0}; do
      taskset -c 1 "$py" -m minedraft.cli bench serve --base-url "http://127.0.0.1:$port" --dataset "$data" \
        --num-prompts "${NUM_PROMPTS:-16}" --output-len "${OUTPUT_LEN:-64}" --ignore-eos --request-rate "$rate" \
        --seed 0 --goodput ttft:5000 tpot:500 --label "$mode $name $rate" \
        --output-json "$out/${mode}_${name}_${rate}.json" > "$out/bench_${mode}_${name}_${rate}.log" 2>&1
      echo "$(date +%H:%M:%S) $mode $name $rate: $(grep -o 'ITL p50.*' "$out/bench_${mode}_${name}_${rate}.log" || true)"
    done
    kill $server; wait $server || true
  done
done
