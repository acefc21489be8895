#!/usr/bin/env bash
# EAGLE draft trees against chains and no speculation, side by side: ShareGPT, greedy, in-process `servetune bench`
# (concurrency C), alternating the settings REPEAT times so a busy host hurts them alike. Prints output tok/s, mean
# TPOT (time per output token after the first: the decode speed, without the prompts' prefill that output tok/s
# includes), vLLM's acceptance length and the draft time per step for: none, topk 1 with 1 step, topk 1 with SGLang's
# 5 steps (6 draft tokens), topk 2 and topk 4 with SGLang's llama tree (5 steps, 8 draft tokens); MODES picks among
# those and ngram (prompt lookup, 4 draft tokens) and topk1-steps2 / topk1-steps3. CHAT=1 sends each ShareGPT first
# turn through the model's chat template (as /v1/chat/completions serves a chat model, and as the SmolLM2 head was
# trained) instead of as raw text.
# Usage: scripts/bench_draft_trees.sh [MODEL] [HEAD] [THREADS] [NUM_PROMPTS] [OUTPUT_LEN] [C]
#        (env: BUILD=build/cpu, REPEAT=1, ALGO=EAGLE (mtp for DeepSeek's own layer: HEAD "-"), MODES="none ngram ...",
#        HEAD_FLAGS="--speculative-token-map F --speculative-draft-model-quantization q8_0": added to every head mode,
#        CHAT=1)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
HEAD=${2:-tests/data/eagle/smollm2_head}
THREADS=${3:-2}
NUM_PROMPTS=${4:-8}
OUTPUT_LEN=${5:-64}
CONC=${6:-1}
ST=${BUILD:-build/cpu}/servetune
[ -x "$ST" ] || { cmake --preset cpu >/dev/null && cmake --build "${BUILD:-build/cpu}" -j "$(nproc)" --target servetune >/dev/null; }
SPEC=(--speculative-algorithm "${ALGO:-EAGLE}")
[ "$HEAD" != "-" ] && SPEC+=(--speculative-draft-model "$HEAD")
read -r -a EXTRA <<< "${HEAD_FLAGS:-}"
SPEC+=("${EXTRA[@]}")
DATA=(--dataset-name sharegpt)
[ "${CHAT:-0}" = 1 ] && DATA+=(--multi-turn --multi-turn-max-turns 1)
read -r -a MODES <<< "${MODES:-none topk1-steps1 topk1-steps5 topk2-steps5-tokens8 topk4-steps5-tokens8}"
flags_for() {
  case "$1" in
    none) flags=() ;;
    ngram) flags=(--speculative-algorithm ngram --speculative-num-draft-tokens 4) ;;
    topk1-steps1) flags=("${SPEC[@]}" --speculative-num-steps 1) ;;
    topk1-steps2) flags=("${SPEC[@]}" --speculative-num-steps 2) ;;
    topk1-steps3) flags=("${SPEC[@]}" --speculative-num-steps 3) ;;
    topk1-steps5) flags=("${SPEC[@]}" --speculative-num-steps 5) ;;
    topk2-steps5-tokens8) flags=("${SPEC[@]}" --speculative-num-steps 5 --speculative-eagle-topk 2 --speculative-num-draft-tokens 8) ;;
    topk4-steps5-tokens8) flags=("${SPEC[@]}" --speculative-num-steps 5 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8) ;;
    *) echo "unknown mode $1" >&2; exit 2 ;;
  esac
}
printf '%-22s %10s %10s %10s %14s\n' setting "tok/s" "TPOT ms" "acc. len" "draft ms/step"
for ((r = 0; r < ${REPEAT:-1}; ++r)); do
  for mode in "${MODES[@]}"; do
    flags_for "$mode"
    out=$("$ST" bench --backend builtin --model "$MODEL" --threads "$THREADS" "${DATA[@]}" \
      --num-prompts "$NUM_PROMPTS" --max-concurrency "$CONC" --seed 0 --sharegpt-output-len "$OUTPUT_LEN" \
      --ignore-eos --temperature 0 "${flags[@]}" 2>&1)
    tput=$(echo "$out" | sed -n 's/^Output token throughput (tok\/s): *\([0-9.]*\).*/\1/p')
    tpot=$(echo "$out" | sed -n 's/^Mean TPOT (ms): *\([0-9.]*\).*/\1/p')
    len=$(echo "$out" | sed -n 's/^Acceptance length: *\([0-9.]*\).*/\1/p')
    draft=$(echo "$out" | sed -n 's/^Draft time per draft (ms): *\([0-9.]*\).*/\1/p')
    printf '%-22s %10s %10s %10s %14s\n' "$mode" "$tput" "$tpot" "${len:--}" "${draft:--}"
  done
done
