#!/usr/bin/env bash
# Overhead of the HTTP layer: total token throughput of `servetune bench --backend openai` against `servetune serve`
# vs `--backend builtin` (the same engine in-process) on the same random workload; then 2,000 streaming connections
# held open at once (most queued), with the server's thread count, memory and CPU while they wait.
# The pairs are interleaved (REPEAT times) and the median ratio reported, so load from other processes on a shared
# machine hits both sides alike.
# Usage: scripts/bench_serve.sh [BUILD_DIR]   env: MODEL CONCURRENCY NUM_PROMPTS INPUT_LEN OUTPUT_LEN THREADS IO_THREADS
#        REPEAT (pairs) HOLD (connections to hold, 0 to skip) OUT (result folder)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/ci}
BIN=$BUILD/servetune
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || MODEL=tests/data/stories260K.gguf
CONCURRENCY=${CONCURRENCY:-64}
NUM_PROMPTS=${NUM_PROMPTS:-512}
INPUT_LEN=${INPUT_LEN:-128}
OUTPUT_LEN=${OUTPUT_LEN:-128}
THREADS=${THREADS:-0}
IO_THREADS=${IO_THREADS:-1}
HOLD=${HOLD:-2000}
REPEAT=${REPEAT:-3}
OUT=${OUT:-results/bench_serve/raw}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "bench_serve: build $BIN first (cmake --build $BUILD --target servetune)" >&2; exit 2; }
ulimit -n "$(ulimit -Hn)"

SERVER_PID=""
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null; true; }
trap cleanup EXIT

# start_server LOG ARGS...: starts `servetune serve` on a free port, sets SERVER_PID and PORT.
start_server() {
  local log=$1
  shift
  "$BIN" serve --model "$MODEL" --port 0 --served-model-name bench --threads "$THREADS" --io-threads "$IO_THREADS" "$@" >"$log" 2>&1 &
  SERVER_PID=$!
  PORT=""
  for _ in $(seq 600); do
    PORT=$(grep -o 'listening on http://[^ ]*' "$log" | sed 's/.*://' || true)
    [ -n "$PORT" ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log" >&2; exit 1; }
    sleep 0.1
  done
  [ -n "$PORT" ] || { echo "bench_serve: server did not start" >&2; cat "$log" >&2; exit 1; }
}
stop_server() {
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID"
  SERVER_PID=""
}

COMMON=(--model "$MODEL" --dataset-name random --random-input-len "$INPUT_LEN" --random-output-len "$OUTPUT_LEN"
  --num-prompts "$NUM_PROMPTS" --max-concurrency "$CONCURRENCY" --ignore-eos --seed 1 --num-warmups "$CONCURRENCY"
  --save-result --result-dir "$OUT")

echo "=== model $MODEL, $NUM_PROMPTS prompts, in $INPUT_LEN / out $OUTPUT_LEN tokens, concurrency $CONCURRENCY, engine threads $THREADS"
echo "=== $REPEAT interleaved pairs: in-process engine (--backend builtin), then through HTTP (--backend openai -> servetune serve)"
start_server "$OUT/serve.log"
for i in $(seq "$REPEAT"); do
  "$BIN" bench --backend builtin --threads "$THREADS" "${COMMON[@]}" --result-filename "builtin_$i.json" >"$OUT/builtin_$i.txt"
  "$BIN" bench --backend openai --port "$PORT" --served-model-name bench "${COMMON[@]}" --result-filename "serve_$i.json" >"$OUT/serve_$i.txt"
  grep -h "Total token throughput" "$OUT/builtin_$i.txt" "$OUT/serve_$i.txt" |
    awk -v i="$i" '{ v[NR] = $NF } END { printf "pair %d: builtin %s tok/s, serve %s tok/s\n", i, v[1], v[2] }'
done
echo "server after $REPEAT runs: $(grep Threads "/proc/$SERVER_PID/status"), $(grep VmHWM "/proc/$SERVER_PID/status")"
for t in /proc/"$SERVER_PID"/task/*; do
  echo "  thread $(basename "$t"): $(awk '{ printf "%.1f", ($14 + $15) / 100 }' "$t/stat") s CPU"
done
stop_server

python3 - "$OUT" "$REPEAT" <<'EOF'
import json, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
load = lambda name: json.load(open(f"{out}/{name}.json"))
pairs = [(load(f"builtin_{i}"), load(f"serve_{i}")) for i in range(1, n + 1)]
ratios = [s["total_token_throughput"] / b["total_token_throughput"] for b, s in pairs]
med = lambda key, k: statistics.median(p[k][key] for p in pairs)
print(f"total token throughput (median of {n}): builtin {med('total_token_throughput', 0):.1f} tok/s, "
      f"serve {med('total_token_throughput', 1):.1f} tok/s; serve/builtin per pair {', '.join(f'{r:.3f}' for r in ratios)}, "
      f"median {statistics.median(ratios):.3f}")
print(f"median of mean TTFT ms: builtin {med('mean_ttft_ms', 0):.2f}, serve {med('mean_ttft_ms', 1):.2f}; "
      f"mean TPOT ms: builtin {med('mean_tpot_ms', 0):.2f}, serve {med('mean_tpot_ms', 1):.2f}")
EOF

[ "$HOLD" -gt 0 ] || exit 0
echo "=== $HOLD streaming connections held open (--max-running-requests 16: the rest wait in the queue)"
start_server "$OUT/hold.log" --max-running-requests 16 --max-queued-requests "$HOLD"
python3 - "$PORT" "$SERVER_PID" "$HOLD" <<'EOF'
import asyncio, json, re, resource, sys, time, urllib.request
port, pid, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (resource.getrlimit(resource.RLIMIT_NOFILE)[1],) * 2)

def metrics():
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'^([a-z_:]+)\{model_name="bench"\} (\S+)$', text, re.M)}

def proc(field):
    return next(l.split(":", 1)[1].strip() for l in open(f"/proc/{pid}/status") if l.startswith(field + ":"))

def cpu():
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / 100

async def main():
    body = json.dumps({"model": "bench", "prompt": "Once upon a time", "max_tokens": 64, "ignore_eos": True, "stream": True}).encode()
    req = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    conns = []
    for _ in range(n):
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(req)
        conns.append((r, w))
    await asyncio.sleep(2)
    m, c0, t0 = metrics(), cpu(), time.time()
    await asyncio.sleep(5)
    c1, t1 = cpu(), time.time()
    print(f"held {n} streaming connections: server threads {proc('Threads')}, RSS {proc('VmRSS')}, "
          f"running {m['vllm:num_requests_running']:.0f}, waiting {m['vllm:num_requests_waiting']:.0f}, "
          f"open connections {m['servetune:http_connections']:.0f}, server CPU {100 * (c1 - c0) / (t1 - t0):.0f}% "
          f"(the engine decoding the 16 running ones)")
    for r, w in conns:
        w.close()
    for _ in range(600):
        m = metrics()
        if m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0 and m["servetune:kv_blocks_used"] == 0:
            break
        time.sleep(0.1)
    print(f"after the clients left: running {m['vllm:num_requests_running']:.0f}, waiting {m['vllm:num_requests_waiting']:.0f}, "
          f"KV blocks used {m['servetune:kv_blocks_used']:.0f}, in flight {m['servetune:requests_in_flight']:.0f}")

asyncio.run(main())
EOF
stop_server
