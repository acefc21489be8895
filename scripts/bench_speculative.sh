#!/usr/bin/env bash
# N-gram, draft-model and EAGLE-head speculative decoding vs none on the built-in engine: single-stream decode tokens/s on a
# repetitive prompt (`servetune generate`, greedy), then ShareGPT at concurrency 1 and 32 (`servetune bench
# --backend builtin`, in-process) with output throughput, TPOT and vLLM's acceptance rate / length. Numbers are
# whatever this machine gives; speculation is expected to lose where the batch is already large (it adds verify
# tokens to every step). The draft model defaults to MODEL itself (no smaller model with SmolLM2's tokenizer is at
# hand): that shows the mechanics and the near-100% acceptance, not a speed-up, since the draft costs as much as the
# target.
# Usage: scripts/bench_speculative.sh [MODEL] [THREADS] [NUM_PROMPTS] [DRAFT_TOKENS] [OUTPUT_LEN]
#        (env: BUILD=build/cpu, MIN_N=1 / MAX_N=12 the n-gram match window, SGLang's defaults;
#         DRAFT=PATH the draft model, EAGLE=DIR an EAGLE head (default tests/data/eagle/smollm2_head) drafting K
#         steps, MODES="off ngram draft" or e.g. "off ngram eagle")
# (ShareGPT requests get max_tokens OUTPUT_LEN, default 128, and EOS is ignored so every run decodes the same amount.)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${2:-2}
NUM_PROMPTS=${3:-32}
K=${4:-4}
OUTPUT_LEN=${5:-128}
ST=${BUILD:-build/cpu}/servetune
[ -x "$ST" ] || { cmake --preset cpu >/dev/null && cmake --build "${BUILD:-build/cpu}" -j "$(nproc)" --target servetune >/dev/null; }
DRAFT=${DRAFT:-$MODEL}
MODES=${MODES:-off ngram draft}
NGRAM=(--speculative-algorithm ngram --speculative-num-draft-tokens "$K"
       --speculative-ngram-min-match-window-size "${MIN_N:-1}" --speculative-ngram-max-match-window-size "${MAX_N:-12}")
DRAFTING=(--speculative-algorithm draft --speculative-draft-model "$DRAFT" --speculative-num-steps "$K")
EAGLING=(--speculative-algorithm EAGLE --speculative-draft-model "${EAGLE:-tests/data/eagle/smollm2_head}"
         --speculative-num-steps "$K")
flags_for() {
  case "$1" in
    ngram) flags=("${NGRAM[@]}") ;;
    draft) flags=("${DRAFTING[@]}") ;;
    eagle) flags=("${EAGLING[@]}") ;;
    *) flags=() ;;
  esac
}
if [[ " $MODES " == *" draft "* ]]; then
  note=""; [ "$DRAFT" = "$MODEL" ] && note=" (the target itself: shows the mechanics and the acceptance, not a speed-up)"
  echo "draft model: $DRAFT$note"
fi

echo "== single stream, repetitive prompt (greedy, 256 tokens) =="
CHAT=$(cat <<'TXT'
Rewrite this Python code, renaming the argument w to width everywhere and changing nothing else:

def area(w, h):
    return w * h

def perimeter(w, h):
    return 2 * (w + h)

def volume(w, h, d):
    return w * h * d

def diagonal(w, h):
    return (w * w + h * h) ** 0.5

def scale(w, h, factor):
    return w * factor, h * factor

def describe(w, h):
    return f"rectangle {w} by {h}, area {area(w, h)}, perimeter {perimeter(w, h)}"
TXT
)
for mode in $MODES; do
  flags_for "$mode"
  out=$("$ST" generate --model "$MODEL" --threads "$THREADS" --chat "$CHAT" --max-tokens 256 "${flags[@]}" 2>&1 >/dev/null)
  printf '%-6s %s\n' "$mode" "$(echo "$out" | grep '^decode:')"
done

echo "== ShareGPT, in-process (output tok/s, mean TPOT, acceptance) =="
for conc in 1 32; do
  for mode in $MODES; do
    flags_for "$mode"
    out=$("$ST" bench --backend builtin --model "$MODEL" --threads "$THREADS" --dataset-name sharegpt \
      --num-prompts "$NUM_PROMPTS" --max-concurrency "$conc" --seed 0 --sharegpt-output-len "$OUTPUT_LEN" \
      --sharegpt-max-prompt-len 512 --ignore-eos "${flags[@]}" 2>&1)
    tput=$(echo "$out" | sed -n 's/^Output token throughput (tok\/s): *\([0-9.]*\).*/\1/p')
    tpot=$(echo "$out" | sed -n 's/^Mean TPOT (ms): *\([0-9.]*\).*/\1/p')
    rate=$(echo "$out" | sed -n 's/^Acceptance rate (%): *\([0-9.]*\).*/\1/p')
    len=$(echo "$out" | sed -n 's/^Acceptance length: *\([0-9.]*\).*/\1/p')
    printf 'concurrency %-3s %-6s output %8s tok/s  mean TPOT %8s ms  acceptance %5s%%  length %s\n' \
      "$conc" "$mode" "$tput" "$tpot" "${rate:--}" "${len:--}"
  done
done
