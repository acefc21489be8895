#!/usr/bin/env bash
# The GPU check, for a session that has the H200 (about 8 minutes): runs the GPU tests (test_gpu_ops, test_gpu_sample,
# test_gpu_parity), then measures a Llama-3-8B-shaped model with dummy bf16 weights generated on the device:
# batch-1 decode (tok/s, bandwidth vs 4.3 TB/s), 2048-token prefill (TFLOP/s vs 790), in-process random 1000/1000
# at concurrency 64 and 256 for compile eager / fused / graphs, and the same shape through PyTorch + transformers.
# Binaries: from .device-bundle/ when present (scripts/device-bundle.sh made it here; its header has the one-shot
# `run` invocation), else the cuda preset (sm_90a) built there, which needs the Debian build dependencies.
# Usage: scripts/device-check.sh LOGDIR   — full logs go to LOGDIR; one table is printed last.
set -uo pipefail
LOG=${1:?usage: scripts/device-check.sh LOGDIR}
mkdir -p "$LOG"
LOG=$(cd "$LOG" && pwd)
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
T0=$(date +%s)
ROWS=()
row() { ROWS+=("$(printf '| %-44s | %-40s |' "$1" "$2")"); }
step() { echo "=== $* (+$(( $(date +%s) - T0 ))s)"; }
BUDGET_S=${BUDGET_S:-480}  # everything inside 8 minutes
# Seconds a step may take: its own cap, or what is left of the budget.
cap() { local left=$(( BUDGET_S - ($(date +%s) - T0) )); [ "$1" -lt "$left" ] && echo "$1" || echo $(( left > 0 ? left : 0 )); }
print_table() {
  echo
  echo "device check $(date -u +%FT%TZ), commit ${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  printf '| %-44s | %-40s |\n' "measurement" "result"
  printf '|%s|%s|\n' "$(printf -- '-%.0s' {1..46})" "$(printf -- '-%.0s' {1..42})"
  for r in "${ROWS[@]}"; do echo "$r"; done
}
trap print_table EXIT

BUNDLE=.device-bundle
if [ -x "$BUNDLE/bin/servetune" ]; then
  step "binaries from $BUNDLE (commit $(cat "$BUNDLE/commit"))"
  # cuBLAS and NCCL: the machine's CUDA toolkit, or the nvidia-* wheels beside PyTorch.
  WHEEL_LIBS=$(python3 -c "import glob, nvidia, os; print(':'.join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib')))))" 2>/dev/null)
  export LD_LIBRARY_PATH="$PWD/$BUNDLE/lib:/usr/local/cuda/lib64:/usr/local/cuda/lib:${WHEEL_LIBS}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  SRC=$(cat "$BUNDLE/source_dir")  # the test binaries read tests/data under the path they were built in
  if [ "$SRC" != "$PWD" ] && [ ! -e "$SRC" ]; then mkdir -p "$(dirname "$SRC")" && ln -s "$PWD" "$SRC"; fi
  ldd "$BUNDLE"/bin/* > "$LOG/ldd.log" 2>&1
  if grep -q 'not found' "$LOG/ldd.log"; then
    grep 'not found' "$LOG/ldd.log" | sort -u
    row "bundle libraries" "MISSING: $(grep 'not found' "$LOG/ldd.log" | awk '{print $1}' | sort -u | tr '\n' ' ' | cut -c1-38)"
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
    row "build (cuda preset)" "FAILED: build.log (or make a bundle)"
    exit 1
  fi
  row "build (cuda preset, sm_90a)" "ok in $(( $(date +%s) - T0 )) s"
  BIN=build/cuda/servetune
  TESTS=(build/cuda/tests/unit/test_gpu_ops build/cuda/tests/unit/test_gpu_sample build/cuda/tests/integration/test_gpu_parity)
fi

step "GPU tests"
for t in "${TESTS[@]}"; do
  name=$(basename "$t")
  timeout "$(cap 120)" "$t" > "$LOG/$name.log" 2>&1
  rc=$?
  summary="$(grep -cE '^\[       OK \]' "$LOG/$name.log") ok, $(grep -cE '^\[  FAILED  \].*\(' "$LOG/$name.log") failed, $(grep -cE '^\[  SKIPPED \].*\(' "$LOG/$name.log") skipped"
  [ $rc -eq 124 ] && summary="$summary, TIMED OUT"
  row "$name (rc $rc)" "$summary"
done

# A Llama-3-8B-shaped config.json (dummy weights need no file) with make-model's byte-level tokenizer.
MODEL="${TMPDIR:-/tmp}/servetune-llama-3-8b-dummy"  # outside LOG: only logs come back
"$BIN" make-model --preset tiny --out "$MODEL" > "$LOG/make_model.log" 2>&1
python3 - "$MODEL/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))  # make-model's fields, reshaped to Llama-3-8B
c.update({"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
          "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 8192,
          "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"})
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY
ENGINE=(--device cuda --load-format dummy -m "$MODEL")
# Matrix bytes read per decoded token (bf16 weights, the embedding row aside) and matmul FLOPs per token.
WEIGHT_BYTES=$(python3 -c "d,f,l,v,kv=4096,14336,32,128256,1024; print(2*(l*(d*(d+2*kv+d)+3*d*f)+v*d))")
FLOPS_PER_TOKEN=$(python3 -c "d,f,l,kv=4096,14336,32,1024; print(2*l*(d*(d+2*kv+d)+3*d*f))")

step "batch-1 decode and 2048-token prefill (servetune generate)"
# Random letters: make-model's byte-level tokenizer has almost no merges, so about one token per character.
PROMPT=$(python3 -c "import random; random.seed(1); print(''.join(random.choice('abcdefghijklmnopqrstuvwxyz ') for _ in range(2047)))")
# compile = graphs: the prefill runs fused, the decode steps replay a captured graph.
timeout "$(cap 120)" "$BIN" generate "${ENGINE[@]}" --compile graphs --prompt "$PROMPT" -n 256 --ignore-eos \
  --chunked-prefill-size 4096 --max-prefill-tokens 4096 > "$LOG/generate.log" 2>&1
PREFILL=$(grep -E '^prefill:' "$LOG/generate.log" | tail -1)
DECODE=$(grep -E '^decode:' "$LOG/generate.log" | tail -1)
if [ -n "$DECODE" ]; then
  TOKS=$(echo "$DECODE" | sed -E 's/.*\(([0-9.]+) tok\/s\).*/\1/')
  row "batch-1 decode, graphs (tok/s)" "$TOKS"
  row "batch-1 decode bandwidth vs 4.3 TB/s" "$(python3 -c "b=$WEIGHT_BYTES*$TOKS; print(f'{b/1e12:.2f} TB/s = {100*b/4.3e12:.0f}% (target 85%)')")"
else
  row "batch-1 decode" "FAILED (see generate.log)"
fi
if [ -n "$PREFILL" ]; then
  NTOK=$(echo "$PREFILL" | sed -E 's/prefill: ([0-9]+) tokens.*/\1/')
  PTOKS=$(echo "$PREFILL" | sed -E 's/.*\(([0-9.]+) tok\/s\).*/\1/')
  row "prefill $NTOK tokens, fused (tok/s)" "$PTOKS"
  row "prefill TFLOP/s vs 790 (matmuls + attention)" "$(python3 -c "
n=$NTOK; t=n/$PTOKS; fl=$FLOPS_PER_TOKEN*n + 4*32*4096*n*n/2
print(f'{fl/t/1e12:.0f} TFLOP/s = {100*fl/t/1e12/790:.0f}% (target 60%)')")"
else
  row "prefill" "FAILED (see generate.log)"
fi

step "in-process random 1000/1000 (servetune bench --backend builtin)"
for conc in 64 256; do
  for mode in eager fused graphs; do
    step "concurrency $conc, compile $mode"
    if [ "$(cap 100)" -lt 20 ]; then row "c=$conc compile=$mode" "skipped: out of time"; continue; fi
    GRAPH_FLAGS=()
    [ "$mode" = graphs ] && GRAPH_FLAGS=(--cuda-graph-max-bs "$conc")
    timeout "$(cap 100)" "$BIN" bench --backend builtin "${ENGINE[@]}" --compile "$mode" "${GRAPH_FLAGS[@]}" --dataset-name random \
      --random-input-len 1000 --random-output-len 1000 --random-range-ratio 0 --num-prompts "$conc" \
      --max-concurrency "$conc" --max-running-requests "$conc" --ignore-eos --seed 1 > "$LOG/bench_c${conc}_${mode}.log" 2>&1
    rc=$?
    OUT=$(grep -E 'Output token throughput' "$LOG/bench_c${conc}_${mode}.log" | awk '{print $NF}')
    if [ -n "$OUT" ]; then row "c=$conc compile=$mode output tok/s" "$OUT"
    elif [ $rc -eq 124 ]; then row "c=$conc compile=$mode" "timed out (step cap 100 s)"
    else row "c=$conc compile=$mode" "$(grep -m1 'error' "$LOG/bench_c${conc}_${mode}.log" | cut -c1-40)"; fi
  done
done

step "PyTorch + transformers generate, same shape (random bf16 weights)"
timeout "$(cap 150)" python3 - "$MODEL/config.json" > "$LOG/transformers.log" 2>&1 <<'PY'
import json, sys, time, torch
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(**{k: v for k, v in json.load(open(sys.argv[1])).items() if k not in ("architectures", "torch_dtype")})
torch.manual_seed(0)
with torch.device("cuda"):
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
for bs, out in ((1, 256), (64, 1000), (256, 1000)):  # whatever fits in the step's time
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
grep -q '^RESULT' "$LOG/transformers.log" || row "transformers generate" "FAILED or timed out (see transformers.log)"
step "done"
