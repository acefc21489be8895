#!/usr/bin/env bash
# SmolLM2-135M-Instruct in float weights (what its HF checkpoint ships) from the Q4_1 GGUF: transformers dequantizes
# the GGUF into an HF checkpoint (OUT/hf, bf16 safetensors), llama.cpp's convert_hf_to_gguf.py writes it as bf16 and
# f16 GGUFs (OUT/smollm2-bf16.gguf, OUT/smollm2-f16.gguf). The float-kernel and speculative benchmarks in
# docs/performance.md and configs/eagle-crossover-bf16.yaml run on these: the Q4_1 weights dequantized, rounded to
# bf16.
# Usage: scripts/smollm2_float_gguf.sh [OUT] [LLAMA_CPP_SRC]
#   OUT defaults to models/smollm2-float; LLAMA_CPP_SRC to the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist
#   (pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/dl/sdist && tar xf ... -C /tmp/dl/sdist).
#   Needs .venv with torch, transformers, gguf and sentencepiece: .venv/bin/pip install torch transformers gguf
#   sentencepiece (CPU wheels; scripts/setup.sh does not install them).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-models/smollm2-float}
SRC=${2:-/tmp/dl/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp}
GGUF=models/SmolLM2-135M-Instruct.Q4_1.gguf
PY=.venv/bin/python
[ -f "$GGUF" ] || { echo "smollm2_float_gguf: $GGUF not found (scripts/setup.sh fetches it)" >&2; exit 2; }
[ -f "$SRC/convert_hf_to_gguf.py" ] || { echo "smollm2_float_gguf: no convert_hf_to_gguf.py under $SRC" >&2; exit 2; }
"$PY" -c 'import torch, transformers, gguf, sentencepiece' 2>/dev/null || {
  echo "smollm2_float_gguf: needs torch, transformers, gguf and sentencepiece in .venv" >&2
  exit 2
}
mkdir -p "$OUT"
"$PY" - "$GGUF" "$OUT/hf" <<'EOF'
import os, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
gguf_path, out = sys.argv[1], sys.argv[2]
folder, name = os.path.split(gguf_path)
model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
# A GGUF-loaded model refuses to save; a fresh one of the same config takes its (dequantized) weights.
config = model.config
config.quantization_config = None
plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
plain.load_state_dict({k: v.to(torch.bfloat16) for k, v in model.state_dict().items()})
plain.save_pretrained(out, safe_serialization=True)
tokenizer.save_pretrained(out)
EOF
for t in bf16 f16; do
  PYTHONPATH="$SRC/gguf-py" "$PY" "$SRC/convert_hf_to_gguf.py" "$OUT/hf" --outtype "$t" \
    --outfile "$OUT/smollm2-$t.gguf" >/dev/null
done
ls -l "$OUT"/smollm2-*.gguf
