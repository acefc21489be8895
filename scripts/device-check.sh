#!/usr/bin/env bash
# The GPU check, for a session that has an H100 or H200 (at most 8 minutes): measures the device's peaks (`servetune
# probe-device`: a copy kernel's bandwidth, a cuBLAS bf16 GEMM's rate, free memory), runs the GPU tests with the
# per-op sync check on (scripts/gpu_tests.sh names them; test_gpu_parity: greedy parity with the CPU engine on
# stories260K, and on SmolLM2 where the model is on the machine: its 98 MB do not fit the 64 MiB carry), then a
# Llama-3-8B-shaped model with dummy bf16 weights generated on the device and a bf16 KV cache: batch-1 decode (tok/s,
# bandwidth against the measured copy bandwidth), 2048-token prefill (TFLOP/s against the measured GEMM rate), greedy
# ids that must agree across compile eager / fused / graphs (a NaN or inf logit is an error), and in-process random
# 1000/1000 at concurrency 64 for each compile mode and at 256 with graphs (lowered to what the KV cache that fits in
# the free memory holds, and said so); and the same shape through PyTorch + transformers. Every step has a time cap
# inside an overall budget that cannot be disabled (a step with too little budget left is skipped and counts as a
# failure); the last line is PASS or FAIL, and the exit status is non-zero on any failure.
# Binaries: from .device-bundle/ when present (scripts/device-bundle.sh made it here; its header has the one-shot
# `run` invocation), else the cuda preset (sm_90a) built there, which needs the Debian build dependencies.
# --dry-run runs the same steps on the CPU device with a tiny shape and short lengths (the probe measures memcpy and
# the CPU backend's bf16 matmul and the sizing reads host memory; no GPU tests, no graphs, no PyTorch): CI runs it so
# a broken script is caught before GPU time is spent (--bin PATH: the servetune to use).
# Usage: scripts/device-check.sh [--dry-run] [--bin PATH] LOGDIR   — full logs go to LOGDIR; one table is printed last.
set -uo pipefail
DRY=0
BIN=
while [ $# -gt 1 ]; do
  case "$1" in
    --dry-run) DRY=1; shift ;;
    --bin) BIN=$2; shift 2 ;;
    *) break ;;
  esac
done
LOG=${1:?usage: scripts/device-check.sh [--dry-run] [--bin PATH] LOGDIR}
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
[ -n "$BIN" ] && BIN=$(realpath -m "$BIN")  # from the caller's directory, before the cd below
cd "$(dirname "$0")/.."
source scripts/gpu_tests.sh
JOBS=${JOBS:-$(nproc)}
ORIG_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}  # PyTorch loads its own CUDA libraries, not the bundle's Debian ones
T0=$(date +%s)
ROWS=()
FAILURES=0
row() { ROWS+=("$(printf '| %-44s | %-40s |' "$1" "$2")"); }
failed() { row "$1" "FAILED: $2"; FAILURES=$((FAILURES + 1)); }
step() { echo "=== $* (+$(( $(date +%s) - T0 ))s)"; }
BUDGET_S=480  # everything inside 8 minutes; not configurable: the device's time is the session's
[ "$DRY" = 1 ] && BUDGET_S=240
# Seconds a step may take: its own cap or what is left of the budget, whichever is less (0 when nothing is left).
cap() { local left=$(( BUDGET_S - ($(date +%s) - T0) )); [ "$1" -lt "$left" ] && echo "$1" || echo $(( left > 0 ? left : 0 )); }
# Runs "$@" under its step's cap; a cap under 10 s skips it (returns 125): `timeout 0` would mean no limit.
capped() {
  local c; c=$(cap "$1"); shift
  [ "$c" -lt 10 ] && return 125
  timeout "$c" "$@"
}
finish() {
  echo
  echo "device check $(date -u +%FT%TZ), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, ${GPU_NAME:-no GPU}$([ "$DRY" = 1 ] && echo ', DRY RUN on the CPU')"
  printf '| %-44s | %-40s |\n' "measurement" "result"
  printf '|%s|%s|\n' "$(printf -- '-%.0s' {1..46})" "$(printf -- '-%.0s' {1..42})"
  for r in "${ROWS[@]}"; do echo "$r"; done
  if [ "$FAILURES" -eq 0 ]; then echo "device check: PASS"; else echo "device check: FAIL ($FAILURES failed steps)"; exit 1; fi
}
trap finish EXIT

BUNDLE=.device-bundle
TESTS=()
# device-bundle.sh packs the binaries (the carry limit is 64 MiB): unpacked here once, by tar or Python's lzma.
if [ "$DRY" != 1 ] && [ -z "$BIN" ] && [ -f "$BUNDLE/bundle.tar.xz" ] && [ ! -x "$BUNDLE/bin/servetune" ]; then
  tar -xJf "$BUNDLE/bundle.tar.xz" -C "$BUNDLE" 2>/dev/null ||
    python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$BUNDLE/bundle.tar.xz" "$BUNDLE"
fi
if [ "$DRY" = 1 ]; then
  BIN=${BIN:-build/cpu/servetune}
  if [ ! -x "$BIN" ]; then failed "binaries (dry run)" "no $BIN (build the cpu preset)"; exit 1; fi
  row "binaries" "$BIN (dry run: CPU device, tiny shape)"
elif [ -n "$BIN" ]; then
  row "binaries" "$BIN"
elif [ -x "$BUNDLE/bin/servetune" ]; then
  step "binaries from $BUNDLE (commit $(cat "$BUNDLE/commit"))"
  # cuBLAS and NCCL: the machine's CUDA toolkit, or the nvidia-* wheels beside PyTorch.
  WHEEL_LIBS=$(python3 -c "import glob, nvidia, os; print(':'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib')))))" 2>/dev/null)
  export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${WHEEL_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  SRC=$(cat "$BUNDLE/source_dir")  # the test binaries read tests/data under the path they were built in
  if [ "$SRC" != "$PWD" ] && [ ! -e "$SRC" ]; then mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; fi
  ldd "$BUNDLE"/bin/* > "$LOG/ldd.log" 2>&1
  if grep -q 'not found' "$LOG/ldd.log"; then
    grep 'not found' "$LOG/ldd.log" | sort -u
    failed "bundle libraries" "missing $(grep 'not found' "$LOG/ldd.log" | awk '{print $1}' | sort -u | tr '\n' ' ' | cut -c1-30)"
    exit 1
  fi
  BIN=$BUNDLE/bin/servetune
  TESTS=("${GPU_TEST_TARGETS[@]/#/$BUNDLE/bin/}")
  COMMIT=$(cat "$BUNDLE/commit")
  row "binaries" "bundle, commit $COMMIT"
else
  step "build (preset cuda, sm_90a; logs in $LOG/build.log)"
  if ! { cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90a && \
         cmake --build build/cuda -j "$JOBS" --target servetune "${GPU_TEST_TARGETS[@]}"; } > "$LOG/build.log" 2>&1; then
    tail -40 "$LOG/build.log"
    failed "build (cuda preset)" "see build.log (or make a bundle)"
    exit 1
  fi
  row "build (cuda preset, sm_90a)" "ok in $(( $(date +%s) - T0 )) s"
  BIN=build/cuda/servetune
  TESTS=("${GPU_TESTS[@]/#/build/cuda/}")
fi

DEVICE=cuda
[ "$DRY" = 1 ] && DEVICE=cpu
step "device peaks (servetune probe-device --device $DEVICE)"
capped 60 "$BIN" probe-device --device "$DEVICE" --json > "$LOG/probe.json" 2> "$LOG/probe.log"
rc=$?
# name, total and free bytes, copy bytes/s (read + write), bf16 GEMM FLOP/s: one line, or nothing.
PROBE=$(python3 -c "
import json; p = json.loads(open('$LOG/probe.json').read().strip().splitlines()[-1])
assert p['copy_bytes_per_s'] > 0 and p['gemm_flops'] > 0 and p['free_bytes'] > 0
print(p['total_bytes'], p['free_bytes'], p['copy_bytes_per_s'], p['gemm_flops'], p.get('fp8_gemm_flops', 0), p['name'])" 2>> "$LOG/probe.log")
if [ -z "$PROBE" ]; then
  failed "device probe (rc $rc)" "see probe.log"
  exit 1  # without the free memory nothing below can be sized
fi
read -r TOTAL_BYTES FREE_BYTES PEAK_BW PEAK_FLOPS FP8_FLOPS GPU_NAME <<< "$PROBE"
row "device" "$GPU_NAME"
row "memory total / free" "$(python3 -c "print(f'{$TOTAL_BYTES/2**30:.1f} / {$FREE_BYTES/2**30:.1f} GiB')")"
row "copy bandwidth, measured (read + write)" "$(python3 -c "print(f'{$PEAK_BW/1e12:.3g} TB/s')")"
row "bf16 GEMM, measured" "$(python3 -c "print(f'{$PEAK_FLOPS/1e12:.3g} TFLOP/s')")"
# The engine's FP8 matmul (activation quantization + cuBLASLt block-scaled GEMM, 8192^3): sm_90 CUDA devices only.
[ "$DRY" = 1 ] || row "FP8 GEMM (block-scaled, 8192^3), measured" "$(python3 -c "f = $FP8_FLOPS; print(f'{f/1e12:.4g} TFLOP/s' if f > 0 else 'not available on this device (needs sm_90)')")"

step "GPU tests (SERVETUNE_GPU_SYNC_CHECK=1: a kernel fault names its op)"
[ "$DRY" = 1 ] && row "GPU tests" "not run (dry run)"
# The test binaries share 240 s (at most 120 each), so the measurements below keep their time whatever the tests take.
TESTS_END=$(( $(date +%s) + 240 ))
for t in "${TESTS[@]}"; do
  name=$(basename "$t")
  tests_left=$(( TESTS_END - $(date +%s) ))
  SERVETUNE_GPU_SYNC_CHECK=1 capped $(( tests_left < 120 ? tests_left : 120 )) "$t" > "$LOG/$name.log" 2>&1
  rc=$?
  ok=$(grep -cE '^\[       OK \]' "$LOG/$name.log"); bad=$(grep -cE '^\[  FAILED  \].*\(' "$LOG/$name.log")
  skipped=$(grep -cE '^\[  SKIPPED \].*\(' "$LOG/$name.log")
  # SmolLM2 (98 MB) cannot travel in the 64 MiB carry: its parity test's skip for the missing file is reported, not
  # failed; any other skip still fails the check.
  smol_missing=0
  if [ "$name" = test_gpu_parity ] && [ "$skipped" -eq 1 ] && grep -qE '^\[  SKIPPED \] GpuParity.SmolLM2' "$LOG/$name.log" &&
     grep -q 'missing .*SmolLM2' "$LOG/$name.log"; then smol_missing=1; fi
  [ "$name" = test_gpu_parity ] && name="test_gpu_parity (greedy = CPU engine)"
  if [ $rc -eq 0 ] && [ "$skipped" -eq 0 ]; then row "$name" "$ok ok"
  elif [ $rc -eq 0 ] && [ "$smol_missing" -eq 1 ]; then row "$name" "$ok ok; SmolLM2 not on the device (not run)"
  elif [ $rc -eq 125 ]; then failed "$name" "skipped: out of budget"
  elif [ $rc -eq 124 ]; then failed "$name" "timed out ($ok ok, $bad failed)"
  else failed "$name (rc $rc)" "$ok ok, $bad failed, $skipped skipped"; fi
done

# A Llama-3-8B-shaped config.json (dummy weights need no file) with make-model's byte-level tokenizer; the dry run
# keeps make-model's tiny shape.
MODEL="${TMPDIR:-/tmp}/servetune-device-check-model-$$"  # outside LOG: only logs come back
trap 'rm -rf "$MODEL"; finish' EXIT
"$BIN" make-model --preset tiny --out "$MODEL" > "$LOG/make_model.log" 2>&1 || { failed "make-model" "see make_model.log"; exit 1; }
if [ "$DRY" = 0 ]; then
  python3 - "$MODEL/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))  # make-model's fields, reshaped to Llama-3-8B
c.update({"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192,
          "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"})
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
fi
read -r D F L V KV H < <(python3 -c "
import json; c = json.load(open('$MODEL/config.json'))
hd = c.get('head_dim', c['hidden_size'] // c['num_attention_heads'])
print(c['hidden_size'], c['intermediate_size'], c['num_hidden_layers'], c['vocab_size'], c['num_key_value_heads'] * hd, c['num_attention_heads'] * hd)")
# The throughput runs: "concurrency compile" each. The compile modes are compared at 64; 256 (the issue's headline
# 1000/1000 number) runs once, with graphs: six runs of 1000/1000 do not fit the budget.
PROMPT_LEN=2047; DECODE_N=256; IO_LEN=1000; MODES=(eager fused graphs); KV_DTYPE=bf16; KV_ELEM=2
RUNS=("64 eager" "64 fused" "64 graphs" "256 graphs")
[ "$DRY" = 1 ] && { PROMPT_LEN=255; DECODE_N=32; IO_LEN=64; MODES=(eager fused); RUNS=("4 eager" "4 fused" "8 fused"); }
PAGE=16
ENGINE=(--device "$DEVICE" --load-format dummy -m "$MODEL" --kv-cache-dtype "$KV_DTYPE" --page-size "$PAGE")
# Matrix bytes read per decoded token (bf16 weights, the embedding row aside) and matmul FLOPs per token.
WEIGHT_BYTES=$(python3 -c "print(2*($L*($D*($H+2*$KV)+$H*$D+3*$D*$F)+$V*$D))")
FLOPS_PER_TOKEN=$(python3 -c "print(2*$L*($D*($H+2*$KV)+$H*$D+3*$D*$F))")
# KV sizing from the measured free memory: 88% of it (the engine's GPU default fraction) less the weights (the
# matrices, the embedding table and the norms, in the storage type) holds the KV cache; the rest is the activations',
# cuBLAS's and the graphs' headroom. A run asks for the KV tokens its sequences can use and no more, at a concurrency
# lowered to what fits: an H100 (80 GB) holds fewer 2000-token sequences than an H200 (141 GB).
MODEL_BYTES=$(python3 -c "print($WEIGHT_BYTES + 2*$V*$D + 2*$D*(2*$L+1))")
KV_TOKEN_BYTES=$((2 * L * KV * KV_ELEM))
KV_FIT_TOKENS=$(python3 -c "print(max(0, int((0.88*$FREE_BYTES - $MODEL_BYTES) // $KV_TOKEN_BYTES)))")
# One sequence's pages at its full length, plus a page: a random prompt re-encodes to within a few tokens of the
# length asked, and a sequence a page short would wait for another to finish.
SEQ_TOKENS=$(( (2 * IO_LEN + 2 * PAGE - 1) / PAGE * PAGE ))
# The dry run's tiny model fits any concurrency: it pretends only 6 sequences fit, so the lowering below runs too.
[ "$DRY" = 1 ] && KV_FIT_TOKENS=$(( KV_FIT_TOKENS < 6 * SEQ_TOKENS ? KV_FIT_TOKENS : 6 * SEQ_TOKENS ))
row "KV cache that fits ($KV_DTYPE)" "$(python3 -c "print(f'{$KV_FIT_TOKENS} tokens = {$KV_FIT_TOKENS // $SEQ_TOKENS} seqs of {2*$IO_LEN}')")"

step "batch-1 decode and ${PROMPT_LEN}-token prefill (servetune generate)"
# Random letters: make-model's byte-level tokenizer has almost no merges, so about one token per character.
PROMPT=$(python3 -c "import random; random.seed(1); print(''.join(random.choice('abcdefghijklmnopqrstuvwxyz ') for _ in range($PROMPT_LEN)))")
# compile = graphs on a GPU: the prefill runs fused, the decode steps replay a captured graph.
GEN_MODE=graphs; [ "$DRY" = 1 ] && GEN_MODE=fused
GEN_KV=(--max-total-tokens $(( (PROMPT_LEN + DECODE_N + 2 * PAGE) / PAGE * PAGE )))
# --warmup 1: the timed prefill is not the process's first forward (kernel set-up, allocations, the graph captures).
capped 120 "$BIN" generate "${ENGINE[@]}" "${GEN_KV[@]}" --compile "$GEN_MODE" --prompt "$PROMPT" -n "$DECODE_N" --ignore-eos --warmup 1 \
  --chunked-prefill-size 4096 --max-prefill-tokens 4096 > "$LOG/generate.log" 2>&1
rc=$?
PREFILL=$(grep -E '^prefill:' "$LOG/generate.log" | tail -1)
DECODE=$(grep -E '^decode:' "$LOG/generate.log" | tail -1)
# Output check on the same prompt, in every compile mode: the requested count of ids, inside the vocabulary and not
# one id repeated (a NaN or inf logit is an error of the device sampler, so generate fails), and the modes agree: the
# same kernels' arithmetic in another grouping, so only a near-tie may flip a token: the first must match and the
# ids must agree on at least 12 of 16 before the first difference.
for mode in "${MODES[@]}"; do
  capped 60 "$BIN" generate "${ENGINE[@]}" "${GEN_KV[@]}" --compile "$mode" --prompt "$PROMPT" -n 16 --ignore-eos --json \
    --chunked-prefill-size 4096 --max-prefill-tokens 4096 > "$LOG/generate_ids_$mode.json" 2> "$LOG/generate_ids_$mode.log"
done
IDS_OK=$(python3 - "$LOG" "$V" "${MODES[@]}" <<'PY' 2>&1
import json, sys
log, vocab, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
ids = {}
for m in modes:
    try:
        ids[m] = json.loads(open(f"{log}/generate_ids_{m}.json").read().strip().splitlines()[-1])["output_ids"]
    except Exception:
        print(f"no ids from compile {m} (generate_ids_{m}.log)"); sys.exit()
for m, v in ids.items():
    if len(v) != 16 or not all(0 <= i < vocab for i in v) or len(set(v)) == 1:
        print(f"bad ids from compile {m}: {v[:4]}"); sys.exit()
ref = ids[modes[0]]
for m in modes[1:]:
    k = 0
    while k < 16 and ids[m][k] == ref[k]: k += 1
    if k < 12:
        print(f"compile {m} differs from {modes[0]} at token {k}"); sys.exit()
print("ok")
PY
)
if [ $rc -eq 125 ]; then failed "generate" "skipped: out of budget"
elif [ -z "$DECODE" ]; then failed "batch-1 decode ($GEN_MODE)" "rc $rc, no decode line (generate.log)"
else
  TOKS=$(echo "$DECODE" | sed -E 's/.*\(([0-9.]+) tok\/s\).*/\1/')
  row "batch-1 decode, $GEN_MODE (tok/s)" "$TOKS"
  row "batch-1 decode bandwidth vs measured copy" "$(python3 -c "b=$WEIGHT_BYTES*$TOKS; print(f'{b/1e12:.3g} TB/s = {100*b/$PEAK_BW:.0f}% (target 85%)')")"
fi
# Finite logits are the GPU sampler's check; the CPU's does not look for NaN.
if [ "$IDS_OK" = ok ]; then row "greedy ids, compile ${MODES[*]}" "agree$([ "$DRY" = 0 ] && echo ', logits finite')"
else failed "greedy ids, compile ${MODES[*]}" "${IDS_OK:-unreadable} (generate_ids_*.log)"; fi
if [ -n "$PREFILL" ]; then
  NTOK=$(echo "$PREFILL" | sed -E 's/prefill: ([0-9]+) tokens.*/\1/')
  PTOKS=$(echo "$PREFILL" | sed -E 's/.*\(([0-9.]+) tok\/s\).*/\1/')
  row "prefill $NTOK tokens (tok/s)" "$PTOKS"
  row "prefill TFLOP/s (matmuls + attention)" "$(python3 -c "
n=$NTOK; t=n/$PTOKS; fl=$FLOPS_PER_TOKEN*n + 4*$L*$H*n*n/2
print(f'{fl/t/1e12:.3g} TFLOP/s = {100*fl/t/$PEAK_FLOPS:.0f}% of measured GEMM (target 60%)')")"
elif [ $rc -ne 125 ]; then
  failed "prefill" "no prefill line (generate.log)"
fi

step "in-process random ${IO_LEN}/${IO_LEN} (servetune bench --backend builtin)"
for run in "${RUNS[@]}"; do
  read -r asked mode <<< "$run"
  conc=$(( KV_FIT_TOKENS / SEQ_TOKENS < asked ? KV_FIT_TOKENS / SEQ_TOKENS : asked ))
  if [ "$conc" -lt 1 ]; then failed "c=$asked compile=$mode" "no $((2 * IO_LEN))-token sequence fits the free memory"; continue; fi
  [ "$conc" -lt "$asked" ] && row "c=$asked lowered to c=$conc ($mode)" "the KV cache for $asked does not fit"
  step "concurrency $conc, compile $mode"
  GRAPH_FLAGS=()
  [ "$mode" = graphs ] && GRAPH_FLAGS=(--cuda-graph-max-bs "$conc")
  capped 120 "$BIN" bench --backend builtin "${ENGINE[@]}" --max-total-tokens $((conc * SEQ_TOKENS)) --compile "$mode" "${GRAPH_FLAGS[@]}" --dataset-name random \
    --random-input-len "$IO_LEN" --random-output-len "$IO_LEN" --random-range-ratio 0 --num-prompts "$conc" \
    --max-concurrency "$conc" --max-running-requests "$conc" --ignore-eos --seed 1 > "$LOG/bench_c${conc}_${mode}.log" 2>&1
  rc=$?
  OUT=$(grep -E 'Output token throughput' "$LOG/bench_c${conc}_${mode}.log" | awk '{print $NF}')
  FAILED_REQ=$(grep -E '^Failed requests' "$LOG/bench_c${conc}_${mode}.log" | awk '{print $NF}')
  if [ $rc -eq 125 ]; then failed "c=$conc compile=$mode" "skipped: out of budget"
  elif [ $rc -eq 124 ]; then failed "c=$conc compile=$mode" "timed out (step cap 120 s)"
  elif [ -z "$OUT" ] || [ "${FAILED_REQ:-0}" != 0 ]; then
    failed "c=$conc compile=$mode" "$(grep -m1 -i 'error' "$LOG/bench_c${conc}_${mode}.log" | cut -c1-30) (rc $rc)"
  else row "c=$conc compile=$mode output tok/s" "$OUT"; fi
done

if [ "$DRY" = 1 ]; then
  row "PyTorch + transformers" "not run (dry run)"
  step "done"
  exit 0
fi
step "PyTorch + transformers generate, same shape (random bf16 weights)"
LD_LIBRARY_PATH=$ORIG_LD_LIBRARY_PATH capped 150 python3 - "$MODEL/config.json" > "$LOG/transformers.log" 2>&1 <<'PY'
import json, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(**{k: v for k, v in json.load(open(sys.argv[1])).items() if k not in ("architectures", "torch_dtype")})
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
for bs, out in ((1, 256), (64, 1000)):  # batch 256 x 1000 new tokens does not fit the step's time
    ids = torch.randint(3, 30000, (bs, 1000 if bs > 1 else 2048), device="cuda")
    torch.cuda.synchronize(); t = time.time()
    with torch.no_grad():
        model.generate(ids, max_new_tokens=out, min_new_tokens=out, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize(); dt = time.time() - t
    print(f"RESULT bs={bs} in={ids.shape[1]} out={out} seconds={dt:.1f} output_tok_s={bs*out/dt:.0f}", flush=True)
PY
while read -r line; do
  row "transformers $(echo "$line" | awk '{print $2, $3, $4}')" "$(echo "$line" | awk '{print $6}' | cut -d= -f2) output tok/s (incl. prefill)"
done < <(grep '^RESULT' "$LOG/transformers.log")
# PyTorch is the reference point, not the engine under test: its absence is noted, not a failure.
grep -q '^RESULT' "$LOG/transformers.log" || row "transformers generate" "not measured (see transformers.log)"
step "done"
