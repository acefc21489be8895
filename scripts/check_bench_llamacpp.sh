#!/usr/bin/env bash
# Manual check of `servetune bench` against a server nobody here wrote: llama.cpp's llama-server (built from the
# llama-cpp-python sdist's vendored source) with SmolLM2-135M Q4_1, random 128/32 with ignore_eos. Passes when
# every request succeeds, each output has exactly --random-output-len tokens, and the server's own
# usage.prompt_tokens equals the dataset's count for every request (so total input = N x 128).
# With GUIDELLM_PYTHON set (a Python with guidellm 0.8, tokenizers, transformers and gguf, e.g.
# `python3 -m venv /tmp/gl && /tmp/gl/bin/pip install guidellm gguf`), it then runs guidellm on the same workload
# (synthetic 128/32, same concurrency and request count), alternating with servetune ROUNDS times, and compares
# request throughput as completed / duration (vLLM's definition). guidellm needs an HF tokenizer: one is built
# from the GGUF's vocabulary and merges and checked against servetune's token counts on the ShareGPT test slice.
# Usage: scripts/check_bench_llamacpp.sh [NUM_PROMPTS] [MAX_CONCURRENCY]
#   env: LLAMA_SERVER (default /tmp/llama-build/bin/llama-server, then /tmp/llama-build-lg/bin/llama-server),
#        SERVETUNE (default build/lg/servetune, then build/*/servetune), PORT (default 18090),
#        GUIDELLM_PYTHON (unset: no comparison), ROUNDS (default 2), LLAMA_THREADS (default 1: on 2 shared
#        cores llama.cpp's spinning worker threads run 2x slower with -t 2 than with -t 1),
#        SERVER_CPUS / CLIENT_CPUS (taskset CPU lists, default 0 and 1 on a 2-CPU machine, else unset: pinning
#        keeps a client's own CPU use from slowing the server it measures).
# Build llama-server if needed (about 10 minutes on 2 cores):
#   cmake -S /tmp/dl/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/llama-build-lg -DGGML_NATIVE=ON \
#     -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release && nice cmake --build /tmp/llama-build-lg -j2 --target llama-server
set -euo pipefail
cd "$(dirname "$0")/.."

N=${1:-64}
CONC=${2:-8}
PORT=${PORT:-18090}
ROUNDS=${ROUNDS:-2}
LLAMA_THREADS=${LLAMA_THREADS:-1}
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
IN_LEN=128
OUT_LEN=32

LLAMA_SERVER=${LLAMA_SERVER:-}
for c in "$LLAMA_SERVER" /tmp/llama-build/bin/llama-server /tmp/llama-build-lg/bin/llama-server; do
  if [ -n "$c" ] && [ -x "$c" ]; then LLAMA_SERVER=$c; break; fi
done
[ -x "${LLAMA_SERVER:-}" ] || { echo "check: no llama-server found; build it (see the header of $0)" >&2; exit 2; }
SERVETUNE=${SERVETUNE:-}
for c in "$SERVETUNE" build/lg/servetune build/*/servetune; do
  if [ -n "$c" ] && [ -x "$c" ]; then SERVETUNE=$c; break; fi
done
[ -x "${SERVETUNE:-}" ] || { echo "check: build servetune first" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "check: $MODEL missing; run scripts/setup.sh" >&2; exit 2; }

if [ "$(nproc)" -eq 2 ]; then
  SERVER_CPUS=${SERVER_CPUS-0}
  CLIENT_CPUS=${CLIENT_CPUS-1}
fi
SERVER_PIN=(); CLIENT_PIN=()
[ -z "${SERVER_CPUS:-}" ] || SERVER_PIN=(taskset -c "$SERVER_CPUS")
[ -z "${CLIENT_CPUS:-}" ] || CLIENT_PIN=(taskset -c "$CLIENT_CPUS")

OUT=$(mktemp -d)
STATUS=0
LOG=$OUT/llama-server.log
SERVER_PID=
# Each measured run gets a freshly started server, so no run is helped by prompts another left in the slots' cache.
start_server() {
  [ -z "$SERVER_PID" ] || { kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null || true; }
  "${SERVER_PIN[@]}" "$LLAMA_SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" -t "$LLAMA_THREADS" -np "$CONC" -c $((CONC * 1024)) \
    --no-webui >>"$LOG" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 120); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "check: llama-server exited; log:" >&2; tail -20 "$LOG" >&2; exit 1; }
    sleep 1
  done
  echo "check: llama-server did not become healthy" >&2
  exit 1
}
trap '[ -z "$SERVER_PID" ] || { kill $SERVER_PID 2>/dev/null; wait $SERVER_PID 2>/dev/null || true; }' EXIT
start_server

"${CLIENT_PIN[@]}" "$SERVETUNE" bench --backend llama.cpp --port "$PORT" --model "$MODEL" --dataset-name random \
  --random-input-len $IN_LEN --random-output-len $OUT_LEN --num-prompts "$N" --max-concurrency "$CONC" \
  --ignore-eos --percentile-metrics ttft,tpot,itl,e2el,client_lag,client_send_lag --metric-percentiles 50,99 \
  --save-result --save-detailed --result-dir "$OUT" --result-filename llamacpp.json | tee "$OUT/stdout.txt"

python3 - "$OUT/llamacpp.json" "$N" "$IN_LEN" "$OUT_LEN" <<'PY_CHECK' || STATUS=1
import json, sys
path, n, in_len, out_len = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = json.load(open(path))
checks = [
    ("successful == num_prompts", r["completed"] == n, r["completed"]),
    ("failed == 0", r["failed"] == 0, r["failed"]),
    ("every output == --random-output-len", all(x == out_len for x in r["output_lens"]), sorted(set(r["output_lens"]))),
    ("total output == N x out", r["total_output_tokens"] == n * out_len, r["total_output_tokens"]),
    ("server usage.prompt_tokens == dataset count", r["prompt_len_mismatches"] == 0, r["prompt_len_mismatches"]),
    ("total input (server usage) == N x in", r["total_input_tokens"] == n * in_len, r["total_input_tokens"]),
]
bad = 0
for name, ok, value in checks:
    print(f"{'PASS' if ok else 'FAIL'}  {name}  ({value})")
    bad += not ok
print(f"request_throughput {r['request_throughput']:.3f} req/s, output_throughput {r['output_throughput']:.1f} tok/s, "
      f"mean TTFT {r['mean_ttft_ms']:.1f} ms, mean TPOT {r['mean_tpot_ms']:.1f} ms; result: {path}")
sys.exit(1 if bad else 0)
PY_CHECK

[ -n "${GUIDELLM_PYTHON:-}" ] || exit $STATUS

GUIDELLM="$(dirname "$GUIDELLM_PYTHON")/guidellm"
TOK=$OUT/hf_tokenizer
"$GUIDELLM_PYTHON" - "$MODEL" "$TOK" <<'PY_TOKENIZER'
# tokenizer.json equivalent to the GGUF's GPT-2 BPE with SmolLM2's pre-tokenizer (single digits, byte level).
import sys
from gguf import GGUFReader
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
model, out = sys.argv[1:3]
r = GGUFReader(model)
def field(name, conv):
    f = r.fields[name]
    return [conv(f.parts[i]) for i in f.data]
tokens = field("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8"))
merges = field("tokenizer.ggml.merges", lambda p: bytes(p).decode("utf-8"))
types = field("tokenizer.ggml.token_type", lambda p: int(p[0]))
tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges]))
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
tok.decoder = decoders.ByteLevel()
tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3])
PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>").save_pretrained(out)
PY_TOKENIZER
"$GUIDELLM_PYTHON" - "$TOK" "$SERVETUNE" "$MODEL" tests/data/sharegpt_slice.json <<'PY_TOKCHECK' || STATUS=1
import json, subprocess, sys
from transformers import AutoTokenizer
tok_dir, servetune, model, slice_path = sys.argv[1:5]
hf = AutoTokenizer.from_pretrained(tok_dir)
texts = [c["value"] for e in json.load(open(slice_path)) for c in e.get("conversations", [])[:2]][:30]
same = sum(hf(t, add_special_tokens=False).input_ids ==
           json.loads(subprocess.check_output([servetune, "tokenize", "--model", model, "--no-special", "--", t]))
           for t in texts)
print(f"HF tokenizer for guidellm: {same}/{len(texts)} ShareGPT slice texts tokenize as servetune (= llama.cpp) does")
sys.exit(0 if same == len(texts) else 1)
PY_TOKCHECK

for round in $(seq "$ROUNDS"); do
  start_server
  "${CLIENT_PIN[@]}" "$SERVETUNE" bench --backend llama.cpp --port "$PORT" --model "$MODEL" --dataset-name random \
    --seed "$round" \
    --random-input-len $IN_LEN --random-output-len $OUT_LEN --num-prompts "$N" --max-concurrency "$CONC" \
    --ignore-eos --save-result --result-dir "$OUT" --result-filename "st_$round.json" >/dev/null
  start_server
  (cd "$OUT" && "${CLIENT_PIN[@]}" "$GUIDELLM" run \
    --backend "kind=openai_http,target=http://127.0.0.1:$PORT,request_format=/v1/completions,model=smollm2" \
    --profile "kind=concurrent,streams=$CONC" --constraint "kind=max_requests,count=$N" \
    --data "kind=synthetic_text,prompt_tokens=$IN_LEN,output_tokens=$OUT_LEN" \
    --tokenizer "kind=huggingface_auto,model=$TOK" --output "kind=json,path=$OUT/gl_$round.json" \
    --disable-console >/dev/null 2>&1)
done
python3 - "$OUT" "$ROUNDS" <<'PY_COMPARE' || STATUS=1
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
st, gl = [], []
for i in range(1, rounds + 1):
    r = json.load(open(f"{out}/st_{i}.json"))
    st.append(r["request_throughput"])
    print(f"round {i} servetune: {r['completed']} ok, {r['duration']:.2f} s, {st[-1]:.4f} req/s, "
          f"prompt tokens {r['total_input_tokens'] / max(r['completed'], 1):.1f}, "
          f"output tokens {r['total_output_tokens'] / max(r['completed'], 1):.1f} per request")
    b = json.load(open(f"{out}/gl_{i}.json"))["benchmarks"][0]
    m = b["metrics"]
    ok = m["request_totals"]["successful"]
    gl.append(ok / b["duration"])
    print(f"round {i} guidellm:  {ok} ok, {b['duration']:.2f} s, {gl[-1]:.4f} req/s "
          f"(its requests_per_second mean {m['requests_per_second']['successful']['mean']:.4f}), "
          f"prompt tokens {m['prompt_token_count']['successful']['mean']:.1f}, "
          f"output tokens {m['output_token_count']['successful']['mean']:.1f} per request")
s, g = sum(st) / len(st), sum(gl) / len(gl)
diff = (s - g) / g * 100
print(f"request throughput over {rounds} rounds: servetune {s:.4f} req/s, guidellm {g:.4f} req/s, "
      f"difference {diff:+.1f}% ({'within' if abs(diff) <= 5 else 'OUTSIDE'} the 5% target)")
sys.exit(0 if abs(diff) <= 5 else 1)
PY_COMPARE
exit $STATUS
