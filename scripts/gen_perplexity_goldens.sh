#!/usr/bin/env bash
# Perplexity goldens from llama.cpp's llama-perplexity (the reference servetune perplexity's windowing follows):
# writes tests/data/perplexity/text.txt (the first human turns of tests/data/sharegpt_slice.json, joined by blank
# lines, first 20,000 characters) and tests/data/perplexity/llama_perplexity.json (PPL and its +/- per model and ctx).
# Needs llama-perplexity built from the llama-cpp-python 0.3.36 sdist's vendored llama.cpp:
#   pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/dl/sdist && tar xf ... &&
#   cmake -S .../vendor/llama.cpp -B /tmp/llama-build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release &&
#   cmake --build /tmp/llama-build --target llama-perplexity
# Usage: scripts/gen_perplexity_goldens.sh [LLAMA_BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-/tmp/llama-build}
OUT=tests/data/perplexity
mkdir -p "$OUT"
python3 - <<'PY'
import json
d = json.load(open('tests/data/sharegpt_slice.json'))
t = '\n\n'.join(c['conversations'][0]['value'] for c in d if c.get('conversations'))
open('tests/data/perplexity/text.txt', 'w').write(t[:20000])
PY
run() {  # model ctx chunks
  LD_LIBRARY_PATH="$BUILD/bin" "$BUILD/bin/llama-perplexity" -m "$1" -f "$OUT/text.txt" -c "$2" -b "$2" --chunks "$3" -t 2 2>&1 |
    sed -n 's/.*Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\).*/\1 \2/p'
}
read -r s_ppl s_err < <(run tests/data/stories260K.gguf 128 -1)
read -r m_ppl m_err < <(run models/SmolLM2-135M-Instruct.Q4_1.gguf 256 8)
cat > "$OUT/llama_perplexity.json" <<JSON
{
  "reference": "llama-perplexity from llama.cpp vendored in llama-cpp-python 0.3.36 (pip sdist)",
  "command": "llama-perplexity -m MODEL -f tests/data/perplexity/text.txt -c CTX -b CTX --chunks CHUNKS",
  "runs": [
    {"model": "tests/data/stories260K.gguf", "ctx": 128, "chunks": -1, "ppl": $s_ppl, "ppl_error": $s_err},
    {"model": "models/SmolLM2-135M-Instruct.Q4_1.gguf", "ctx": 256, "chunks": 8, "ppl": $m_ppl, "ppl_error": $m_err}
  ]
}
JSON
cat "$OUT/llama_perplexity.json"
