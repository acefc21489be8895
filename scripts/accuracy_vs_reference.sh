#!/usr/bin/env bash
# servetune's and llama.cpp's KL divergence against an f32 reference of the same GGUF (scripts/kl_vs_reference.py),
# for SmolLM2-135M-Instruct Q4_1 as shipped and its Q4_0 / Q8_0 / Q4_K_M requantisations, on the committed perplexity
# text. Needs build/cpu/servetune, llama-perplexity and llama-quantize from llama-cpp-python 0.3.36's llama.cpp
# (scripts/gen_perplexity_goldens.sh says how to build them), and .venv with gguf + numpy. TEXT=FILE scores another text
# (scripts/sharegpt_text.py writes a larger one); the servetune files take ~25 MB a chunk and are removed after use.
# Usage: [TEXT=FILE] scripts/accuracy_vs_reference.sh [LLAMA_BUILD_DIR] [CTX] [CHUNKS] [FORMATS...]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-/tmp/llama-build}
CTX=${2:-256}
CHUNKS=${3:-4}
shift $(($# < 3 ? $# : 3))
FORMATS=("${@:-Q4_1 Q4_0 Q8_0 Q4_K_M}")
read -r -a FORMATS <<< "${FORMATS[*]}"
SRC=models/SmolLM2-135M-Instruct.Q4_1.gguf
TEXT=${TEXT:-tests/data/perplexity/text.txt}
WORK=${WORK:-/tmp/servetune-accuracy}
mkdir -p "$WORK"
export LD_LIBRARY_PATH="$BUILD/bin"
for fmt in "${FORMATS[@]}"; do
  model=$SRC
  if [ "$fmt" != Q4_1 ]; then
    model=$WORK/smollm2.$fmt.gguf
    [ -f "$model" ] || "$BUILD/bin/llama-quantize" --allow-requantize "$SRC" "$model" "$fmt" > "$WORK/quantize.$fmt.log" 2>&1
  fi
  build/cpu/servetune perplexity --model "$model" --dataset "$TEXT" --ctx "$CTX" --chunks "$CHUNKS" --threads 2 \
      --save-logprobs "$WORK/st.$fmt.logprobs" | grep Final | sed "s/^/$fmt servetune  /"
  "$BUILD/bin/llama-perplexity" -m "$model" -f "$TEXT" -c "$CTX" -b "$CTX" --chunks "$CHUNKS" -t 2 \
      --kl-divergence-base "$WORK/llama.$fmt.kld" 2>&1 | grep 'Final estimate' | sed "s/.*Final/$fmt llama.cpp  Final/"
  .venv/bin/python scripts/kl_vs_reference.py "$model" "$WORK/st.$fmt.logprobs" "$WORK/llama.$fmt.kld" \
      --json "$WORK/kl.$fmt.json" | sed "s/^/$fmt /"
  rm -f "$WORK/st.$fmt.logprobs"
done
