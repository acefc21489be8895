#!/usr/bin/env bash
# Tokenizer encode throughput, servetune vs llama.cpp, on the same ShareGPT text (first human turns of the
# first 2000 conversations): servetune's Google Benchmark (tests/bench/bench_tokenizer.cpp) and llama.cpp's
# llama_tokenize called through llama-cpp-python's ctypes binding with a preallocated buffer, both per prompt
# and on ~1 MiB chunks (prompts joined by "\n\n"), so Python's per-call overhead is negligible in the latter.
#   bash scripts/bench_tokenizer.sh [BUILD_DIR]      (default build/tok; needs scripts/setup.sh's files)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/tok}
REPS=${REPS:-5}

if [ ! -x "$BUILD/tests/bench/bench_tokenizer" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$BUILD" --target bench_tokenizer >/dev/null
fi
"$BUILD/tests/bench/bench_tokenizer" --benchmark_filter=run_encode --benchmark_repetitions="$REPS" \
  --benchmark_report_aggregates_only=true --benchmark_format=json --benchmark_out=/tmp/servetune_bench_tokenizer.json \
  --benchmark_out_format=json >/dev/null

python3 - "$REPS" <<'PY'
import ctypes, json, statistics, sys, time
sys.path.insert(0, "scripts")
from gen_tokenizer_goldens import sharegpt_prompts
import llama_cpp

reps = int(sys.argv[1])
prompts = [p for _, _, p in sharegpt_prompts("datasets/cache/ShareGPT_V3_unfiltered_cleaned_split.json", 2000)]
chunks = [""]
for p in prompts:
    if len(chunks[-1].encode()) > (1 << 20):
        chunks.append("")
    chunks[-1] += p + "\n\n"

ours = {}
for b in json.load(open("/tmp/servetune_bench_tokenizer.json"))["benchmarks"]:
    if b.get("aggregate_name") == "median":
        ours[b["run_name"].split("/", 1)[1]] = (b["bytes_per_second"], b["tokens/s"])

def llama_rate(path, texts):
    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    data = [t.encode() for t in texts]
    cap = max(len(d) for d in data) + 16
    buf = (llama_cpp.llama_token * cap)()
    rates = []
    for _ in range(reps):
        n_tok = 0
        t0 = time.perf_counter()
        for d in data:
            n_tok += llama_cpp.llama_tokenize(vocab, d, len(d), buf, cap, True, False)
        dt = time.perf_counter() - t0
        rates.append((sum(map(len, data)) / dt, n_tok / dt))
    return statistics.median(r[0] for r in rates), statistics.median(r[1] for r in rates)

print(f"{'benchmark':32} {'servetune MB/s':>15} {'llama.cpp MB/s':>15} {'ratio':>7} {'servetune Mtok/s':>17} {'llama.cpp Mtok/s':>17}")
for name, path in [("stories260K", "tests/data/stories260K.gguf"), ("smollm2", "models/SmolLM2-135M-Instruct.Q4_1.gguf")]:
    for shape, texts in [("per_prompt", prompts), ("chunks", chunks)]:
        key = f"{name}_{shape}"
        lb, lt = llama_rate(path, texts)
        ob, ot = ours[key]
        print(f"{key:32} {ob/1e6:15.2f} {lb/1e6:15.2f} {ob/lb:6.2f}x {ot/1e6:17.3f} {lt/1e6:17.3f}")
PY
