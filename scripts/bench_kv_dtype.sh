#!/usr/bin/env bash
# Two KV cache element types side by side on the built-in engine (in-process, random 128 in / 128 out, ignore_eos):
# total token throughput at concurrency 1 and 32, in alternating A B B A rounds so the host's drift hits both alike;
# prints each side's median and each round's B/A ratio.
# Usage: scripts/bench_kv_dtype.sh [BUILD_DIR]   env: MODEL THREADS ROUNDS A=f16 B=fp8_e4m3 OUT
source "$(dirname "$0")/bench_common.sh"  # strict mode, repository root, bench_start
NAME=bench_kv_dtype
THREADS=${THREADS:-2}
ROUNDS=${ROUNDS:-4}
A=${A:-f16}
B=${B:-fp8_e4m3}
OUT=${OUT:-results/bench_kv_dtype/raw}
bench_start "$@"

run() {  # KV_DTYPE CONCURRENCY PROMPTS NAME
  "$BIN" bench --backend builtin --model "$MODEL" --threads "$THREADS" --kv-cache-dtype "$1" --max-concurrency "$2" \
    --num-prompts "$3" --num-warmups "$([ "$2" = 1 ] && echo 1 || echo 32)" --dataset-name random \
    --random-input-len 128 --random-output-len 128 --ignore-eos --seed 1 \
    --save-result --result-dir "$OUT" --result-filename "$4.json" >"$OUT/$4.txt"
}

echo "=== $MODEL, $THREADS threads, KV cache $A vs $B, random 128/128, $ROUNDS rounds of A B B A"
for conc in 1 32; do
  prompts=$([ "$conc" = 1 ] && echo 4 || echo 64)
  for i in $(seq "$ROUNDS"); do
    run "$A" "$conc" "$prompts" "c${conc}_a_${i}_1"
    run "$B" "$conc" "$prompts" "c${conc}_b_${i}_1"
    run "$B" "$conc" "$prompts" "c${conc}_b_${i}_2"
    run "$A" "$conc" "$prompts" "c${conc}_a_${i}_2"
  done
done

python3 - "$OUT" "$ROUNDS" "$A" "$B" <<'PY'
import json, statistics, sys
out, n, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def tps(name):
    return json.load(open(f"{out}/{name}.json"))["total_token_throughput"]
for conc in (1, 32):
    side = {s: [tps(f"c{conc}_{s}_{i}_{k}") for i in range(1, n + 1) for k in (1, 2)] for s in ("a", "b")}
    rounds = [(tps(f"c{conc}_b_{i}_1") + tps(f"c{conc}_b_{i}_2")) / (tps(f"c{conc}_a_{i}_1") + tps(f"c{conc}_a_{i}_2"))
              for i in range(1, n + 1)]
    print(f"concurrency {conc}: {a} {statistics.median(side['a']):.1f} tok/s, {b} {statistics.median(side['b']):.1f} tok/s "
          f"-> {b}/{a} per round " + ", ".join(f"{r:.3f}" for r in rounds) + f" (median {statistics.median(rounds):.3f})")
PY
