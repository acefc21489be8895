#!/usr/bin/env bash
# Tensor parallel on one machine, one thread per rank: in-process total token throughput of tp 1, tp 2 over the local
# communicator (rank threads of one process) and tp 2 over gloo (two processes: the bench is node_rank 0, and
# `servetune serve --node-rank 1` the worker), random 128 in / 128 out at concurrency 32, with the share of forward
# time spent in collectives (engine_comm_fraction) and rank 0's further wait for the other rank. Rounds alternate the
# three sides and medians are reported, so load from other processes on a shared machine hits each alike.
# Usage: scripts/bench_parallel.sh [BUILD_DIR]   env: MODEL REPEAT PROMPTS WARMUPS OUT PORT
source "$(dirname "$0")/bench_common.sh"  # strict mode, repository root, bench_start
NAME=bench_parallel
REPEAT=${REPEAT:-3}
PROMPTS=${PROMPTS:-64}
WARMUPS=${WARMUPS:-32}
OUT=${OUT:-results/bench_parallel/raw}
PORT=${PORT:-29531}
bench_start "$@"

WL=(--dataset-name random --random-input-len 128 --random-output-len 128 --ignore-eos --seed 1 --max-concurrency 32
    --num-prompts "$PROMPTS" --num-warmups "$WARMUPS")
GLOO=(--tp-size 2 --comm-backend gloo --nnodes 2 --dist-init-addr "127.0.0.1:$PORT" --threads 1)
run() {  # NAME [ENGINE FLAGS...]
  local name=$1
  shift
  "$BIN" bench --backend builtin --model "$MODEL" "${WL[@]}" --save-result --result-dir "$OUT" --result-filename "$name.json" \
    "$@" >"$OUT/$name.txt"
}

echo "=== $MODEL, random 128/128, concurrency 32, one thread per rank, $REPEAT alternating rounds"
for i in $(seq "$REPEAT"); do
  run "tp1_$i" --threads 1
  run "tp2_local_$i" --threads 2 --tp-size 2
  "$BIN" serve --model "$MODEL" "${GLOO[@]}" --node-rank 1 >"$OUT/worker_$i.log" 2>&1 &
  BG_PID=$!
  run "tp2_gloo_$i" "${GLOO[@]}" --node-rank 0
  wait "$BG_PID"  # the worker stops when node 0 shuts the group down
  BG_PID=""
  echo "round $i done"
done

python3 - "$OUT" "$REPEAT" <<'PY'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
def med(name, key):
    return statistics.median(json.load(open(f"{out}/{name}_{i}.json"))[key] for i in range(1, n + 1))
def runs(name, key):
    return ", ".join(f"{json.load(open(f'{out}/{name}_{i}.json'))[key]:.0f}" for i in range(1, n + 1))
for name, what in (("tp1", "tp 1, 1 thread"), ("tp2_local", "tp 2 local (threads), 1 thread/rank"),
                   ("tp2_gloo", "tp 2 gloo (2 processes), 1 thread/rank")):
    line = f"{what:42} total {med(name, 'total_token_throughput'):7.1f} tok/s (runs {runs(name, 'total_token_throughput')})"
    if name != "tp1":
        line += (f", collectives {100 * med(name, 'engine_comm_fraction'):.1f}% of forward time"
                 f" ({med(name, 'engine_comm_ms_per_step'):.1f} ms/step)"
                 f" + rank 0 waiting {100 * med(name, 'engine_comm_wait_fraction'):.1f}%")
    print(line)
PY
