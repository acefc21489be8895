#!/usr/bin/env bash
# Single-stream speed of the built-in engine against llama.cpp's llama-bench on the same model and thread count:
# 512-token prefill tokens/s and 128-token decode tokens/s (PROMPT_TOKENS / GEN_TOKENS change them, e.g. for the tiny
# test models' 256-token context), median of N alternating runs, plus decode memory-bandwidth
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

# A prompt of exactly PROMPT_TOKENS tokens for this model (BOS included).
PROMPT=$(python3 - "$ST" "$MODEL" "$PROMPT_TOKENS" <<'PY'
import json, subprocess, sys
st, model, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
words = ("the quick brown fox jumps over the lazy dog while seven wizards quietly judge boxing matches " * 80).split()
lo, hi = 1, len(words)
while lo < hi:  # longest word prefix with <= want tokens
    mid = (lo + hi + 1) // 2
    n = len(json.loads(subprocess.check_output([st, "tokenize", "--model", model, " ".join(words[:mid])])))
    lo, hi = (mid, hi) if n <= want else (lo, mid - 1)
print(" ".join(words[:lo]))
PY
)

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2)? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
st_pp=(); st_tg=(); ll_pp=(); ll_tg=()
for i in $(seq "$RUNS"); do
  out=$("$ST" generate --model "$MODEL" --threads "$THREADS" --prompt "$PROMPT" --max-tokens 1 2>&1 >/dev/null)
  st_pp+=("$(echo "$out" | sed -n 's/^prefill: .*(\(.*\) tok\/s)/\1/p')")
  out=$("$ST" generate --model "$MODEL" --threads "$THREADS" --prompt "Once upon a time" --max-tokens $((GEN_TOKENS + 1)) --ignore-eos 2>&1 >/dev/null)
  st_tg+=("$(echo "$out" | sed -n 's/^decode: .*(\(.*\) tok\/s)/\1/p')")
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
printf '%-28s %12s %12s %8s\n' "" servetune llama.cpp ratio
printf '%-28s %12.1f %12.1f %7.2fx\n' "prefill $PROMPT_TOKENS tokens (tok/s)" "$sp" "$lp" "$(echo "$sp / $lp" | bc -l)"
printf '%-28s %12.1f %12.1f %7.2fx\n' "decode $GEN_TOKENS tokens (tok/s)" "$st" "$lt" "$(echo "$st / $lt" | bc -l)"
python3 -c "
w, st, bw = $weights, $st, $bw
print(f'decode bandwidth: {w/1e6:.1f} MB of weights per token x {st:.1f} tok/s = {w*st/1e9:.1f} GB/s of {bw/1e9:.1f} GB/s measured read bandwidth with $THREADS threads ({100*w*st/bw:.0f}% of roofline)')"
