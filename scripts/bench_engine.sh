#!/usr/bin/env bash
# Single-stream speed of the built-in engine against llama.cpp's llama-bench on the same model and thread count:
# 512-token prefill tokens/s and 128-token decode tokens/s (PROMPT_TOKENS / GEN_TOKENS change them, e.g. for the tiny
# test models' 256-token context), median (and best) of N alternating runs, plus decode memory-bandwidth
# utilisation (weight bytes read per token x tokens/s / measured read bandwidth).
# Usage: scripts/bench_engine.sh [MODEL] [THREADS] [RUNS]   (LLAMA_BENCH=path/to/llama-bench, ST=path/to/servetune
# to time another build of servetune, e.g. a copy of an earlier commit's binary)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${2:-2}
RUNS=${3:-5}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
GEN_TOKENS=${GEN_TOKENS:-128}
LLAMA_BENCH=${LLAMA_BENCH:-/tmp/llama-build/bin/llama-bench}
ST=${ST:-./build/cpu/servetune}
[ -x "$ST" ] || [ "$ST" != ./build/cpu/servetune ] || { cmake --preset cpu >/dev/null && cmake --build build/cpu -j "$(nproc)" --target servetune bench_matmul >/dev/null; }
[ -x "$ST" ] || { echo "bench_engine: servetune binary not found at $ST" >&2; exit 2; }
[ -x "$LLAMA_BENCH" ] || { echo "llama-bench not found at $LLAMA_BENCH (build llama.cpp from the llama-cpp-python sdist; see README)" >&2; exit 2; }
# The weight count and the bandwidth probe need the gguf and numpy packages: the system Python's or .venv's.
PY=python3
if ! "$PY" -c 'import gguf, numpy' 2>/dev/null; then
  PY=.venv/bin/python
  [ -x "$PY" ] && "$PY" -c 'import gguf, numpy' 2>/dev/null || {
    echo "bench_engine: needs the Python packages gguf and numpy (e.g. .venv/bin/pip install gguf numpy)" >&2
    exit 2
  }
fi

# servetune is timed warm, as llama-bench times llama.cpp (it runs one untimed pass first): each run is one
# `servetune bench` process at concurrency 1 with prefix caching off, whose warm-up requests (about 30 ms of work)
# come before the measured ones; prefill is PROMPT_TOKENS / the median time to first token and decode 1 / the median
# time per output token. Both include what llama-bench leaves out (scheduling, sampling, the token stream), so the
# ratio errs against servetune. A cold engine's first forward (page faults in fresh buffers) costs milliseconds, all
# of a tiny model's prefill, and on the 2-vCPU session hosts the first ~15 ms of requests after a start often run
# 2-3x slower.
st_bench() {  # st_bench INPUT_LEN OUTPUT_LEN WARMUPS PROMPTS ttft|tpot -> its median in ms over the measured requests
  local dir
  dir=$(mktemp -d)
  "$ST" bench --backend builtin --model "$MODEL" --threads "$THREADS" --disable-radix-cache --max-concurrency 1 \
    --dataset-name random --random-input-len "$1" --random-output-len "$2" --ignore-eos --num-prompts "$3" \
    --save-result --save-detailed --result-dir "$dir" --result-filename r.json >/dev/null 2>&1 ||
    { echo "bench_engine: servetune bench failed on $MODEL" >&2; rm -rf "$dir"; exit 1; }
  python3 - "$dir/r.json" "$5" <<'PY'
import json, statistics, sys
r = json.load(open(sys.argv[1]))
warm = range(len(r["ttfts"]))  # the warm-up requests are not in the result
if sys.argv[2] == "ttft":
    print(statistics.median(1000 * r["ttfts"][i] for i in warm))
else:  # time per output token after the first
    print(statistics.median(1000 * (r["latencies"][i] - r["ttfts"][i]) / (r["output_lens"][i] - 1) for i in warm))
PY
  rm -rf "$dir"
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
best() { sort -g | tail -1; }
st_pp=(); st_tg=(); ll_pp=(); ll_tg=()
for i in $(seq "$RUNS"); do
  ttft_ms=$(st_bench "$PROMPT_TOKENS" 1 30 15 ttft)
  st_pp+=("$(echo "1000 * $PROMPT_TOKENS / $ttft_ms" | bc -l)")
  tpot_ms=$(st_bench 8 $((GEN_TOKENS + 1)) 8 5 tpot)
  st_tg+=("$(echo "1000 / $tpot_ms" | bc -l)")
  js=$("$LLAMA_BENCH" -m "$MODEL" -t "$THREADS" -p "$PROMPT_TOKENS" -n "$GEN_TOKENS" -r 1 -o json 2>/dev/null)
  ll_pp+=("$(echo "$js" | python3 -c 'import json,sys; print([r["avg_ts"] for r in json.load(sys.stdin) if r["n_prompt"]>0][0])')")
  ll_tg+=("$(echo "$js" | python3 -c 'import json,sys; print([r["avg_ts"] for r in json.load(sys.stdin) if r["n_gen"]>0][0])')")
done
sp=$(printf '%s\n' "${st_pp[@]}" | median); st=$(printf '%s\n' "${st_tg[@]}" | median)
lp=$(printf '%s\n' "${ll_pp[@]}" | median); lt=$(printf '%s\n' "${ll_tg[@]}" | median)
weights=$("$PY" - "$MODEL" <<'PY'
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
names = {t.name for t in r.tensors}
total = sum(int(t.n_bytes) for t in r.tensors if t.name != "token_embd.weight" or "output.weight" not in names)
print(total)  # every matrix is read once per decoded token (the tied embedding as the output head)
PY
)
bw=$("$PY" - "$THREADS" <<'PY'
import sys, threading, time
import numpy as np
n = int(sys.argv[1])  # one 512 MiB array per thread, summed concurrently (numpy releases the GIL)
arrays = [np.ones(1 << 27, dtype=np.float32) for _ in range(n)]
best = 0
for _ in range(5):
    threads = [threading.Thread(target=a.sum) for a in arrays]
    t = time.perf_counter()
    for th in threads: th.start()
    for th in threads: th.join()
    best = max(best, sum(a.nbytes for a in arrays) / (time.perf_counter() - t))
print(best)
PY
)
printf '\nmodel %s, %s threads, median of %s runs\n' "$MODEL" "$THREADS" "$RUNS"
# Medians, and the best run of each side: on a shared host neighbours slow whole runs of either side for seconds.
bp=$(printf '%s\n' "${st_pp[@]}" | best); bt=$(printf '%s\n' "${st_tg[@]}" | best)
blp=$(printf '%s\n' "${ll_pp[@]}" | best); blt=$(printf '%s\n' "${ll_tg[@]}" | best)
printf '%-28s %12s %12s %8s   %12s %12s %8s\n' "" servetune llama.cpp ratio "best: st" llama.cpp ratio
printf '%-28s %12.1f %12.1f %7.2fx   %12.1f %12.1f %7.2fx\n' "prefill $PROMPT_TOKENS tokens (tok/s)" "$sp" "$lp" \
  "$(echo "$sp / $lp" | bc -l)" "$bp" "$blp" "$(echo "$bp / $blp" | bc -l)"
printf '%-28s %12.1f %12.1f %7.2fx   %12.1f %12.1f %7.2fx\n' "decode $GEN_TOKENS tokens (tok/s)" "$st" "$lt" \
  "$(echo "$st / $lt" | bc -l)" "$bt" "$blt" "$(echo "$bt / $blt" | bc -l)"
python3 -c "
w, st, bw = $weights, $st, $bw
print(f'decode bandwidth: {w/1e6:.1f} MB of weights per token x {st:.1f} tok/s = {w*st/1e9:.1f} GB/s of {bw/1e9:.1f} GB/s measured read bandwidth with $THREADS threads ({100*w*st/bw:.0f}% of roofline)')"
