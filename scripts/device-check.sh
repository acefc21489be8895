#!/usr/bin/env bash
# The GPU check, for a session that has an H100 or H200 (at most 8 minutes): runs the GPU tests (test_gpu_ops,
# test_gpu_sample, test_gpu_parity), then measures a Llama-3-8B-shaped model with dummy bf16 weights generated on the
# device: batch-1 decode (tok/s, bandwidth against the GPU's datasheet peak), 2048-token prefill (TFLOP/s against its
# bf16 dense peak), in-process random 1000/1000 at concurrency 64 and 256 for compile eager / fused / graphs, and the
# same shape through PyTorch + transformers. Every step has a time cap inside an overall budget that cannot be
# disabled (a step with too little budget left is skipped and counts as a failure); the last line is PASS or FAIL,
# and the exit status is non-zero on any failure.
# Binaries: from .device-bundle/ when present (scripts/device-bundle.sh made it here; its header has the one-shot
# `run` invocation), else the cuda preset (sm_90a) built there, which needs the Debian build dependencies.
# --dry-run runs the same steps on the CPU device with a tiny shape and short lengths (no GPU tests, no graphs, no
# PyTorch): CI runs it so a broken script is caught before GPU time is spent (--bin PATH: the servetune to use).
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

GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
# Datasheet peaks (memory bandwidth, bf16 dense tensor FLOP/s) of the GPU the machine has.
case "$GPU_NAME" in
  *H200*) PEAK_BW=4.8e12; PEAK_FLOPS=989e12 ;;
  *H100*) PEAK_BW=3.35e12; PEAK_FLOPS=989e12 ;;
  *) PEAK_BW=; PEAK_FLOPS= ;;
esac

BUNDLE=.device-bundle
TESTS=()
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
  TESTS=("$BUNDLE/bin/test_gpu_ops" "$BUNDLE/bin/test_gpu_sample" "$BUNDLE/bin/test_gpu_parity")
  COMMIT=$(cat "$BUNDLE/commit")
  row "binaries" "bundle, commit $COMMIT"
else
  step "build (preset cuda, sm_90a; logs in $LOG/build.log)"
  if ! { cmake --preset cuda -DCMAKE_CUDA_ARCHITECTURES=90a && \
         cmake --build build/cuda -j "$JOBS" --target servetune test_gpu_ops test_gpu_sample test_gpu_parity; } > "$LOG/build.log" 2>&1; then
    tail -40 "$LOG/build.log"
    failed "build (cuda preset)" "see build.log (or make a bundle)"
    exit 1
  fi
  row "build (cuda preset, sm_90a)" "ok in $(( $(date +%s) - T0 )) s"
  BIN=build/cuda/servetune
  TESTS=(build/cuda/tests/unit/test_gpu_ops build/cuda/tests/unit/test_gpu_sample build/cuda/tests/integration/test_gpu_parity)
fi

step "GPU tests"
[ "$DRY" = 1 ] && row "GPU tests" "not run (dry run)"
for t in "${TESTS[@]}"; do
  name=$(basename "$t")
  capped 120 "$t" > "$LOG/$name.log" 2>&1
  rc=$?
  ok=$(grep -cE '^\[       OK \]' "$LOG/$name.log"); bad=$(grep -cE '^\[  FAILED  \].*\(' "$LOG/$name.log")
  skipped=$(grep -cE '^\[  SKIPPED \].*\(' "$LOG/$name.log")
  if [ $rc -eq 0 ] && [ "$skipped" -eq 0 ]; then row "$name" "$ok ok"
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
DEVICE=cuda; PROMPT_LEN=2047; DECODE_N=256; IO_LEN=1000; CONCS=(64 256); MODES=(eager fused graphs)
[ "$DRY" = 1 ] && { DEVICE=cpu; PROMPT_LEN=255; DECODE_N=32; IO_LEN=64; CONCS=(4 8); MODES=(eager fused); }
ENGINE=(--device "$DEVICE" --load-format dummy -m "$MODEL")
# Matrix bytes read per decoded token (bf16 weights, the embedding row aside) and matmul FLOPs per token.
WEIGHT_BYTES=$(python3 -c "print(2*($L*($D*($H+2*$KV)+$H*$D+3*$D*$F)+$V*$D))")
FLOPS_PER_TOKEN=$(python3 -c "print(2*$L*($D*($H+2*$KV)+$H*$D+3*$D*$F))")

step "batch-1 decode and ${PROMPT_LEN}-token prefill (servetune generate)"
# Random letters: make-model's byte-level tokenizer has almost no merges, so about one token per character.
PROMPT=$(python3 -c "import random; random.seed(1); print(''.join(random.choice('abcdefghijklmnopqrstuvwxyz ') for _ in range($PROMPT_LEN)))")
# compile = graphs on a GPU: the prefill runs fused, the decode steps replay a captured graph.
GEN_MODE=graphs; [ "$DRY" = 1 ] && GEN_MODE=fused
capped 120 "$BIN" generate "${ENGINE[@]}" --compile "$GEN_MODE" --prompt "$PROMPT" -n "$DECODE_N" --ignore-eos \
  --chunked-prefill-size 4096 --max-prefill-tokens 4096 > "$LOG/generate.log" 2>&1
rc=$?
PREFILL=$(grep -E '^prefill:' "$LOG/generate.log" | tail -1)
DECODE=$(grep -E '^decode:' "$LOG/generate.log" | tail -1)
# Output check on the same prompt and mode: the requested count of ids, inside the vocabulary and not one id
# repeated (NaN logits would still give a speed: the argmax of a NaN row is one fixed id).
capped 60 "$BIN" generate "${ENGINE[@]}" --compile "$GEN_MODE" --prompt "$PROMPT" -n 16 --ignore-eos --json \
  --chunked-prefill-size 4096 --max-prefill-tokens 4096 > "$LOG/generate_ids.json" 2> "$LOG/generate_ids.log"
IDS_OK=$(python3 -c "
import json
ids = json.loads(open('$LOG/generate_ids.json').read().strip().splitlines()[-1])['output_ids']
print('ok' if len(ids) == 16 and all(0 <= i < $V for i in ids) and len(set(ids)) > 1 else 'bad ids ' + str(ids[:4]))" 2>/dev/null)
if [ $rc -eq 125 ]; then failed "generate" "skipped: out of budget"
elif [ -z "$DECODE" ] || [ "$IDS_OK" != ok ]; then failed "batch-1 decode ($GEN_MODE)" "rc $rc, outputs ${IDS_OK:-unreadable} (generate.log)"
else
  TOKS=$(echo "$DECODE" | sed -E 's/.*\(([0-9.]+) tok\/s\).*/\1/')
  row "batch-1 decode, $GEN_MODE (tok/s)" "$TOKS"
  if [ -n "$PEAK_BW" ]; then
    row "batch-1 decode bandwidth vs datasheet" "$(python3 -c "b=$WEIGHT_BYTES*$TOKS; print(f'{b/1e12:.2f} TB/s = {100*b/$PEAK_BW:.0f}% of {$PEAK_BW/1e12:.2f} (target 85%)')")"
  else
    row "batch-1 decode weight bandwidth" "$(python3 -c "print(f'{$WEIGHT_BYTES*$TOKS/1e9:.1f} GB/s')")"
  fi
fi
if [ -n "$PREFILL" ]; then
  NTOK=$(echo "$PREFILL" | sed -E 's/prefill: ([0-9]+) tokens.*/\1/')
  PTOKS=$(echo "$PREFILL" | sed -E 's/.*\(([0-9.]+) tok\/s\).*/\1/')
  row "prefill $NTOK tokens (tok/s)" "$PTOKS"
  row "prefill TFLOP/s (matmuls + attention)" "$(python3 -c "
n=$NTOK; t=n/$PTOKS; fl=$FLOPS_PER_TOKEN*n + 4*$L*$H*n*n/2; peak='$PEAK_FLOPS'
print(f'{fl/t/1e12:.1f} TFLOP/s' + (f' = {100*fl/t/float(peak):.0f}% of datasheet (target 60%)' if peak else ''))")"
elif [ $rc -ne 125 ]; then
  failed "prefill" "no prefill line (generate.log)"
fi

step "in-process random ${IO_LEN}/${IO_LEN} (servetune bench --backend builtin)"
for conc in "${CONCS[@]}"; do
  for mode in "${MODES[@]}"; do
    step "concurrency $conc, compile $mode"
    GRAPH_FLAGS=()
    [ "$mode" = graphs ] && GRAPH_FLAGS=(--cuda-graph-max-bs "$conc")
    capped 100 "$BIN" bench --backend builtin "${ENGINE[@]}" --compile "$mode" "${GRAPH_FLAGS[@]}" --dataset-name random \
      --random-input-len "$IO_LEN" --random-output-len "$IO_LEN" --random-range-ratio 0 --num-prompts "$conc" \
      --max-concurrency "$conc" --max-running-requests "$conc" --ignore-eos --seed 1 > "$LOG/bench_c${conc}_${mode}.log" 2>&1
    rc=$?
    OUT=$(grep -E 'Output token throughput' "$LOG/bench_c${conc}_${mode}.log" | awk '{print $NF}')
    FAILED_REQ=$(grep -E '^Failed requests' "$LOG/bench_c${conc}_${mode}.log" | awk '{print $NF}')
    if [ $rc -eq 125 ]; then failed "c=$conc compile=$mode" "skipped: out of budget"
    elif [ $rc -eq 124 ]; then failed "c=$conc compile=$mode" "timed out (step cap 100 s)"
    elif [ -z "$OUT" ] || [ "${FAILED_REQ:-0}" != 0 ]; then
      failed "c=$conc compile=$mode" "$(grep -m1 -i 'error' "$LOG/bench_c${conc}_${mode}.log" | cut -c1-30) (rc $rc)"
    else row "c=$conc compile=$mode output tok/s" "$OUT"; fi
  done
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
