#!/usr/bin/env bash
# Does batching pay? In-process total token throughput of the built-in engine at concurrency 1 and 32 (random
# 128 in / 128 out, ignore_eos), against llama.cpp's llama-server (continuous batching, --parallel 32, same
# threads) on the same workload through HTTP; then a shared-prefix workload with the prefix cache on and off
# (hit rate and mean TTFT). Runs alternate REPEAT times and medians are reported, so load from other processes
# on a shared machine hits every side alike. The built-in engine stores its KV cache in f16 (KV_DTYPE), the type
# llama-server uses by default, so both engines read the same cache bytes per token. Warm-up requests repeat the
# workload's first prompt (vLLM's convention), so the measured run's first request finds its prompt cached; enough
# prompts at concurrency 1 keep that one skipped prefill from flattering it.
# Usage: scripts/bench_runtime.sh [BUILD_DIR]   env: MODEL THREADS REPEAT PROMPTS_C1 PROMPTS_C32 KV_DTYPE LLAMA_SERVER OUT
#   IN_LEN OUT_LEN (random workload lengths, default 128 each), PREFIX=0 skips the shared-prefix workload (its
#   384-token system prompts exceed the tiny test models' context)
source "$(dirname "$0")/bench_common.sh"  # strict mode, repository root, bench_start
NAME=bench_runtime
THREADS=${THREADS:-2}
REPEAT=${REPEAT:-3}
PROMPTS_C1=${PROMPTS_C1:-8}
PROMPTS_C32=${PROMPTS_C32:-64}
KV_DTYPE=${KV_DTYPE:-f16}
IN_LEN=${IN_LEN:-128}
OUT_LEN=${OUT_LEN:-128}
PREFIX=${PREFIX:-1}
LLAMA_SERVER=${LLAMA_SERVER:-/tmp/llama-build/bin/llama-server}
OUT=${OUT:-results/bench_runtime/raw}
PORT=${PORT:-18093}
bench_start "$@"

RANDOM_WL=(--dataset-name random --random-input-len "$IN_LEN" --random-output-len "$OUT_LEN" --ignore-eos --seed 1)
run_builtin() {  # NAME CONCURRENCY PROMPTS [ENGINE FLAGS...]
  local name=$1 conc=$2 n=$3
  shift 3
  "$BIN" bench --backend builtin --model "$MODEL" --threads "$THREADS" --kv-cache-dtype "$KV_DTYPE" \
    --max-concurrency "$conc" --num-prompts "$n" \
    --save-result --result-dir "$OUT" --result-filename "$name.json" "$@" >"$OUT/$name.txt"
}

HAVE_LLAMA=0
if [ -x "$LLAMA_SERVER" ]; then
  HAVE_LLAMA=1
else
  echo "bench_runtime: $LLAMA_SERVER not found; skipping the llama-server comparison (see README to build it)" >&2
fi
# A fresh llama-server for each round, as each built-in run is a fresh engine: a server kept across rounds answers
# the next round's prompts (the same seed) from its slots' prompt cache, skipping their prefill, and later rounds
# would look faster than the first.
start_llama_server() {  # ROUND
  # 32 slots of 256 tokens each (128 in + 128 out).
  "$LLAMA_SERVER" -m "$MODEL" -t "$THREADS" -tb "$THREADS" --parallel 32 -c 8192 --cont-batching --port "$PORT" \
    >"$OUT/llama-server_$1.log" 2>&1 &
  BG_PID=$!
  for _ in $(seq 300); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && return 0
    kill -0 "$BG_PID" 2>/dev/null || { cat "$OUT/llama-server_$1.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "bench_runtime: llama-server did not become healthy within 60 s (log: $OUT/llama-server_$1.log)" >&2
  exit 1
}

echo "=== $MODEL, $THREADS threads, KV cache $KV_DTYPE, random $IN_LEN/$OUT_LEN, $REPEAT alternating rounds"
for i in $(seq "$REPEAT"); do
  run_builtin "c1_$i" 1 "$PROMPTS_C1" "${RANDOM_WL[@]}" --num-warmups 1
  run_builtin "c32_$i" 32 "$PROMPTS_C32" "${RANDOM_WL[@]}" --num-warmups 32
  if [ "$HAVE_LLAMA" = 1 ]; then
    start_llama_server "$i"
    "$BIN" bench --backend llama.cpp --port "$PORT" --model "$MODEL" --max-concurrency 32 --num-prompts "$PROMPTS_C32" \
      "${RANDOM_WL[@]}" --num-warmups 32 --save-result --result-dir "$OUT" --result-filename "llama_$i.json" >"$OUT/llama_$i.txt"
    cleanup_bg
    BG_PID=""
  fi
  if [ "$PREFIX" = 1 ]; then
  PREFIX_WL=(--dataset-name prefix --prefix-num-groups 4 --prefix-system-prompt-len 384 --prefix-question-len 32
    --prefix-output-len 16 --seed 1)
  run_builtin "prefix_on_$i" 8 64 "${PREFIX_WL[@]}"
  run_builtin "prefix_off_$i" 8 64 "${PREFIX_WL[@]}" --disable-radix-cache
  fi
  echo "round $i done"
done

python3 - "$OUT" "$REPEAT" "$HAVE_LLAMA" "$PREFIX" <<'PY'
import json, statistics, sys
out, n, have_llama, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4] == "1"
def rounds(name, key):
    return [json.load(open(f"{out}/{name}_{i}.json"))[key] for i in range(1, n + 1)]
def med(name, key):
    return statistics.median(rounds(name, key))
c1, c32 = med("c1", "total_token_throughput"), med("c32", "total_token_throughput")
print(f"in-process total token throughput: concurrency 1 {c1:.1f} tok/s, concurrency 32 {c32:.1f} tok/s "
      f"-> {c32 / c1:.2f}x (target >= 5x)")
# Each round's two runs ran back to back, so their ratio is the least exposed to the host's drift.
def per_round(base, name):
    return [b / a for a, b in zip(rounds(base, "total_token_throughput"), rounds(name, "total_token_throughput"))]
batching = per_round("c1", "c32")
print("  per round: " + ", ".join(f"{r:.2f}x" for r in batching) + f" (median {statistics.median(batching):.2f}x)")
if have_llama:
    llama = rounds("llama", "total_token_throughput")
    ll = statistics.median(llama)
    print(f"llama-server --parallel 32, concurrency 32: {ll:.1f} tok/s -> servetune/llama.cpp {c32 / ll:.2f}x (target >= 2x)")
    print("  llama-server per round: " + ", ".join(f"{x:.1f}" for x in llama)
          + " tok/s; servetune/llama.cpp per round: " + ", ".join(f"{r:.2f}x" for r in per_round("llama", "c32")))
for mode in ("on", "off") if prefix else ():
    print(f"shared prefix, prefix cache {mode:3}: hit rate {med('prefix_' + mode, 'engine_prefix_cache_hit_rate'):.3f}, "
          f"mean TTFT {med('prefix_' + mode, 'mean_ttft_ms'):.1f} ms, "
          f"total {med('prefix_' + mode, 'total_token_throughput'):.1f} tok/s")
PY
