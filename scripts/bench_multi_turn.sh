#!/usr/bin/env bash
# First-turn ShareGPT against multi-turn ShareGPT with the built-in engine's prefix cache on and off: the same number
# of requests either way (first turns only, or SESSIONS conversations of up to TURNS turns whose later turns re-send
# their history). Every run is a fresh `servetune bench --backend builtin` process, so each starts with an empty
# cache; modes alternate within each round. Prints per run and as medians over rounds: throughput, TTFT (all, and
# later turns), the prefix-cache hit rate, the prompt tokens the engine computed, and goodput under a TTFT SLO;
# capacity is the highest concurrency whose p99 TTFT met the SLO in every round.
# Usage: scripts/bench_multi_turn.sh [BUILD]
#        (env: MODEL, ROUNDS=2, LEVELS="1 2 4 8", SESSIONS=16, TURNS=4, OUTPUT_LEN=32, SLO_MS=1000, THREADS=2)
NAME=bench_multi_turn
OUT=${OUT:-/tmp/servetune-bench-multi-turn}
source "$(dirname "$0")/bench_common.sh"
bench_start "$@"
ROUNDS=${ROUNDS:-2}
LEVELS=${LEVELS:-1 2 4 8}
SLO_MS=${SLO_MS:-1000}
COMMON=(--backend builtin --model "$MODEL" --threads "${THREADS:-2}" --dataset-name sharegpt --seed 0
        --sharegpt-output-len "${OUTPUT_LEN:-32}" --ignore-eos --temperature 0 --goodput "ttft:$SLO_MS" --save-result)
MULTI=(--multi-turn --multi-turn-max-turns "${TURNS:-4}" --num-prompts "${SESSIONS:-16}"
       --sharegpt-max-prompt-len 2048 --sharegpt-max-total-len 4096)
rm -f "$OUT"/*.json
for round in $(seq 1 "$ROUNDS"); do
  for c in $LEVELS; do
    "$BIN" bench "${COMMON[@]}" "${MULTI[@]}" --max-concurrency "$c" --result-filename "$OUT/on-c$c-r$round.json" > /dev/null
    # As many first turns as the multi-turn run had requests.
    n=$(python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(j["completed"] + j["failed"])' "$OUT/on-c$c-r$round.json")
    "$BIN" bench "${COMMON[@]}" --num-prompts "$n" --max-concurrency "$c" --result-filename "$OUT/first-c$c-r$round.json" > /dev/null
    "$BIN" bench "${COMMON[@]}" "${MULTI[@]}" --max-concurrency "$c" --disable-radix-cache \
        --result-filename "$OUT/off-c$c-r$round.json" > /dev/null
    echo "round $round concurrency $c done" >&2
  done
done
python3 - "$OUT" "$SLO_MS" <<'PY'
import glob, json, os, re, statistics, sys
out, slo = sys.argv[1], float(sys.argv[2])
runs = {}
for f in glob.glob(os.path.join(out, "*.json")):
    mode, c, _ = re.match(r"(\w+)-c(\d+)-r(\d+)\.json", os.path.basename(f)).groups()
    runs.setdefault((mode, int(c)), []).append(json.load(open(f)))
names = {"first": "first-turn", "on": "multi-turn, cache on", "off": "multi-turn, cache off"}
cols = [("requests", "completed"), ("input tok", "total_input_tokens"), ("engine prompt tok", "engine_prompt_tokens"),
        ("hit rate", "engine_prefix_cache_hit_rate"), ("total tok/s", "total_token_throughput"),
        ("mean TTFT", "mean_ttft_ms"), ("p99 TTFT", "p99_ttft_ms"), ("later-turn mean TTFT", "later_turns_mean_ttft_ms"),
        ("later-turn p99 TTFT", "later_turns_p99_ttft_ms"), (f"goodput TTFT<={slo:g}ms req/s", "request_goodput")]
print("| workload | concurrency | " + " | ".join(c for c, _ in cols) + " |")
print("|---|---:|" + "---:|" * len(cols))
capacity = {}
for mode in ("first", "on", "off"):
    for c in sorted(c for m, c in runs if m == mode):
        rs = runs[(mode, c)]
        if all(r["p99_ttft_ms"] <= slo for r in rs):
            capacity[mode] = max(capacity.get(mode, 0), c)
        cells = []
        for _, k in cols:
            v = [r[k] for r in rs if k in r]
            if not v:
                cells.append("-")
                continue
            m = statistics.median(v)
            if k.endswith("hit_rate"):
                cells.append(f"{m:.0%}")
            else:
                cells.append(f"{m:.0f}" if m >= 100 or float(m).is_integer() else f"{m:.2f}")
        print(f"| {names[mode]} | {c} | " + " | ".join(cells) + " |")
print()
for mode in ("first", "on", "off"):
    print(f"capacity (p99 TTFT <= {slo:g} ms in every round), {names[mode]}: "
          + (f"concurrency {capacity[mode]}" if mode in capacity else "none of the levels"))
PY
