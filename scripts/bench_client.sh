#!/usr/bin/env bash
# Client speed: `servetune bench` (libcurl multi, one epoll loop) against servetune_mock_openai on loopback, side
# by side with a minimal asyncio/aiohttp client of the kind `vllm bench serve` uses (same mock, same workload).
# Three workloads per concurrency level C:
#   burst  C requests at once of STREAM_EVENTS events each (default 200), the mock streams as fast as it can:
#          sustained SSE events/s the client absorbs;
#   short  the same with 20-event streams (SHORT=0 skips it): mostly connection setup and teardown, not streaming;
#   paced  Poisson arrivals keeping about C streams open, the mock paces tokens: client lag, which is what a late
#          client adds to every latency it reports.
# Client lag (read lag) is per event: the time the client processed the event minus the time the mock stamped on it
# when writing it ("sent-ns:" line, CLOCK_MONOTONIC ns; servetune reads clock_gettime(CLOCK_MONOTONIC), Python
# time.monotonic_ns(), the same clock on Linux), over every event of the run. In the burst runs it is mostly the
# backlog in the socket buffers of a client that is saturated by design; the paced runs are where it means lateness.
# Send lag is per request: when the client sent it minus when it was due (its arrival time, or when a concurrency
# slot freed).
# Each line reports events/s (wall), the client's own CPU seconds during the run and events per CPU second (robust
# when client and mock share a few busy cores), read lag p50 / p99 and send lag p50 / p99.
# Usage: scripts/bench_client.sh [C ...]   (default: 1000 10000). Needs python3 with aiohttp (PYTHON=... to pick
# one) and a build (BUILD=build/lg). Raises RLIMIT_NOFILE to the hard limit and says so if that is too low.
# STREAM_EVENTS=N: events per stream in the burst runs; PACED=0 skips the paced runs.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build/lg}
SERVETUNE=$BUILD/servetune
MOCK=$BUILD/loadgen/servetune_mock_openai
PYTHON=${PYTHON:-python3}
TOKENIZER=tests/data/stories260K.gguf
STREAM_EVENTS=${STREAM_EVENTS:-200}
SHORT=${SHORT:-1}
PACED=${PACED:-1}
LEVELS=("$@")
[ ${#LEVELS[@]} -gt 0 ] || LEVELS=(1000 10000)
[ -x "$SERVETUNE" ] && [ -x "$MOCK" ] || { echo "bench_client: build servetune and servetune_mock_openai in $BUILD" >&2; exit 2; }
"$PYTHON" -c "import aiohttp" 2>/dev/null || { echo "bench_client: $PYTHON has no aiohttp (pip install aiohttp)" >&2; exit 2; }

HARD=$(ulimit -Hn)
ulimit -n "$HARD" 2>/dev/null || true
echo "RLIMIT_NOFILE soft=$(ulimit -n) hard=$HARD"
WORK=$(mktemp -d)
PYCLIENT=$WORK/aiohttp_client.py
cat >"$PYCLIENT" <<'EOF'
# Minimal vllm-bench-serve-style client: one asyncio task per request, aiohttp streaming, SSE split on blank lines,
# json.loads per event, perf_counter timestamps; the read lag of each event from the mock's "sent-ns:" line.
# Prints one JSON line of results.
import asyncio, json, sys, time, resource
import aiohttp
import numpy as np

url, n, out_len, rate, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

async def one(session, prompt, scheduled, start_ts, res):
    st = time.perf_counter()
    res["send_lags"].append(st - (start_ts + scheduled))
    payload = {"model": "mock", "prompt": prompt, "max_tokens": out_len, "stream": True,
               "stream_options": {"include_usage": True}, "ignore_eos": True}
    events, buf, done = 0, "", False
    try:
        async with session.post(url, json=payload) as r:
            if r.status != 200:
                res["failed"] += 1
                return
            async for chunk in r.content.iter_any():
                buf += chunk.decode("utf-8")
                while "\n\n" in buf:
                    msg, buf = buf.split("\n\n", 1)
                    data = None
                    for line in msg.split("\n"):
                        if line.startswith("data: "):
                            data = line[6:]
                        elif line.startswith("sent-ns: "):
                            res["lags"].append(time.monotonic_ns() - int(line[9:]))
                    if data is None:
                        continue
                    if data == "[DONE]":
                        done = True
                        continue
                    j = json.loads(data)
                    if j.get("choices"):
                        time.perf_counter()
                        events += 1
        res["events"] += events
        res["ok" if done else "failed"] += 1
    except Exception:
        res["failed"] += 1

async def main():
    if rate == float("inf"):
        delays = np.zeros(n)
    else:
        rng = np.random.default_rng(seed)
        delays = np.cumsum(rng.gamma(1.0, 1.0 / rate, n))
        delays *= (n / rate) / delays[-1]
    res = {"events": 0, "ok": 0, "failed": 0, "lags": [], "send_lags": []}
    conn = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=False)
    async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=6 * 3600)) as s:
        start = time.perf_counter()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        tasks = []
        for i in range(n):
            wait = start + delays[i] - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(wait)
            tasks.append(asyncio.create_task(one(s, "one two three four", delays[i], start, res)))
        await asyncio.gather(*tasks)
        dur = time.perf_counter() - start
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    lags = np.array(res["lags"]) / 1e6
    send_lags = np.array(res["send_lags"]) * 1000
    pct = lambda a, p: round(float(np.percentile(a, p)), 3) if len(a) else None
    print(json.dumps({"client": "python-aiohttp", "ok": res["ok"], "failed": res["failed"], "events": res["events"],
                      "duration_s": dur, "events_per_s": res["events"] / dur, "client_cpu_s": cpu,
                      "events_per_cpu_s": res["events"] / cpu, "lag_events": len(lags),
                      "lag_p50_ms": pct(lags, 50), "lag_p99_ms": pct(lags, 99),
                      "send_lag_p50_ms": pct(send_lags, 50), "send_lag_p99_ms": pct(send_lags, 99)}))

asyncio.run(main())
EOF

start_mock() {  # $1: --itl-us
  "$MOCK" --port 0 --itl-us "$1" >"$WORK/mock.port" &
  MOCK_PID=$!
  for _ in $(seq 50); do grep -q listening "$WORK/mock.port" 2>/dev/null && break; sleep 0.1; done
  PORT=$(sed -n 's/.*://p' "$WORK/mock.port")
}
stop_mock() { kill "$MOCK_PID" 2>/dev/null; wait "$MOCK_PID" 2>/dev/null || true; }
trap 'stop_mock 2>/dev/null || true' EXIT

run_servetune() {  # $1 n, $2 out_len, $3 rate
  "$SERVETUNE" bench --backend openai --port "$PORT" --model mock --tokenizer "$TOKENIZER" --dataset-name random \
    --random-input-len 8 --random-output-len "$2" --num-prompts "$1" --request-rate "$3" --seed 1 \
    --percentile-metrics client_lag,client_send_lag --metric-percentiles 50,99 --save-result --save-detailed \
    --result-dir "$WORK" --result-filename st.json >/dev/null
  "$PYTHON" - "$WORK/st.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
events = sum(len(itl) + 1 for itl, err in zip(r["itls"], r["errors"]) if not err)
ms = lambda k: round(r[k], 3) if k in r else None  # client_lag keys are absent when no event carried a stamp
print(json.dumps({"client": "servetune", "ok": r["completed"], "failed": r["failed"], "events": events,
                  "duration_s": r["duration"], "events_per_s": events / r["duration"],
                  "client_cpu_s": r["process_cpu_s"], "events_per_cpu_s": events / r["process_cpu_s"],
                  "lag_events": r["client_lag_events"],
                  "lag_p50_ms": ms("p50_client_lag_ms"), "lag_p99_ms": ms("p99_client_lag_ms"),
                  "send_lag_p50_ms": ms("p50_client_send_lag_ms"), "send_lag_p99_ms": ms("p99_client_send_lag_ms")}))
EOF
}
run_python() { "$PYTHON" "$PYCLIENT" "http://127.0.0.1:$PORT/v1/completions" "$1" "$2" "$3" 1; }

# How late this machine wakes a sleeping process right now (a floor under any client's lag).
"$PYTHON" - <<'PY_WAKE'
import time
late = []
for _ in range(500):
    t = time.perf_counter() + 0.002
    time.sleep(0.002)
    late.append((time.perf_counter() - t) * 1000)
late.sort()
print(f"== OS wake-up lateness for a 2 ms sleep: p50 {late[250]:.3f} ms, p99 {late[495]:.3f} ms, max {late[-1]:.3f} ms")
PY_WAKE

for C in "${LEVELS[@]}"; do
  # burst: C streams at once, as many events as the mock can write; then (short) 20-event streams.
  BURSTS=("$STREAM_EVENTS")
  [ "$SHORT" = 1 ] && BURSTS+=(20)
  start_mock 0
  for OUT in "${BURSTS[@]}"; do
    echo "== burst: $C concurrent streams x $OUT events (mock --itl-us 0), load average $(cut -d' ' -f1 /proc/loadavg)"
    run_servetune "$C" "$OUT" inf
    run_python "$C" "$OUT" inf
  done
  stop_mock
  [ "$PACED" = 1 ] || continue
  # paced: 5 s streams (25 tokens, one every 200 ms); Poisson arrivals at C/5 per second keep about C open.
  start_mock 200000
  RATE=$(( C / 5 ))
  echo "== paced: ~$C open streams (Poisson $RATE req/s, $((2 * C)) requests, 25 tokens at 5/s each), load average $(cut -d' ' -f1 /proc/loadavg)"
  run_servetune $((2 * C)) 25 "$RATE"
  run_python $((2 * C)) 25 "$RATE"
  stop_mock
done
