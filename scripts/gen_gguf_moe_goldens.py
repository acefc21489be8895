#!/usr/bin/env python3
"""GGUF conversions of the tiny MoE / MLA models made by llama.cpp's own converter, and llama.cpp's greedy ids on them.

For issue #37: converts tests/data/hf_models/{qwen3_moe_tiny, mixtral_tiny, deepseek_v3_tiny, deepseek_v2_lite_tiny,
deepseek_v2_group_tiny} and a tiny Qwen2-MoE built here (build_qwen2_moe) with convert_hf_to_gguf.py from the llama.cpp vendored in the llama-cpp-python 0.3.36 sdist
(f32, written to tests/data/gguf_moe/<model>.gguf), then runs 8 token-id prompts x 64 new tokens each through that
llama.cpp's library with greedy decoding (scripts/llamacpp_greedy.cpp) and writes tests/data/gguf_moe/greedy.json.

Usage: /work/assets/hfvenv/bin/python scripts/gen_gguf_moe_goldens.py
  env: LLAMA_CPP  the vendored llama.cpp tree (default /tmp/dl/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp;
                  fetched with `pip download llama-cpp-python==0.3.36 --no-binary :all:` when absent)
       LLAMA_BUILD its build folder (default /tmp/llama-build; the `llama` library is built there when missing,
                  about 10 minutes on 2 cores)
The Python running it needs what the converter needs: torch, transformers, safetensors, numpy, sentencepiece (the
converter's `gguf` package comes from the same llama.cpp tree).

What is adjusted, and why (everything else is the converter's own output):
  * Tokenizer: the tiny models' tokenizer.json is GPT-2's byte-level BPE pre-tokenizer over a private 259-token
    vocabulary with no merges. The converter identifies pre-tokenizers by hashing the ids of a test string, which no
    private vocabulary can match, so it refuses ("BPE pre-tokenizer was not recognized"); when that happens and the
    tokenizer's pre-tokenizer is byte-level with GPT-2's split regex, the label "gpt-2" is written, which is what it
    is. gguf-py refuses to write an empty array, and llama.cpp refuses a BPE vocabulary with no merges key, so the
    (empty) merges list is written as a zero-length string array. The goldens are token ids, so neither touches them.
  * deepseek_v3_tiny: transformers 5.25 writes DeepseekV3's config.json without `scoring_func` (its class hard-codes
    sigmoid); the converter only writes expert_gating_func when the key is there, and llama.cpp then falls back to
    softmax (its default for old DeepSeek-V2 files). The converter is given a copy of the config with
    "scoring_func": "sigmoid", as DeepSeek-V3's published config.json has.
  * deepseek_v2_*_tiny (q_lora_rank null): llama.cpp's loader requires `deepseek2.attention.q_lora_rank` unless the
    model has V2-Lite's layer count (26, 27 or 48), and the converter writes it only when set; the conversion adds
    q_lora_rank = 0 (plain q projection), which is what llama.cpp's loader then uses.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDIST_VERSION = "0.3.36"
LLAMA_CPP = Path(os.environ.get("LLAMA_CPP", f"/tmp/dl/sdist/llama_cpp_python-{SDIST_VERSION}/vendor/llama.cpp"))
LLAMA_BUILD = Path(os.environ.get("LLAMA_BUILD", "/tmp/llama-build"))
MODELS = ["qwen3_moe_tiny", "mixtral_tiny", "deepseek_v3_tiny", "deepseek_v2_lite_tiny", "deepseek_v2_group_tiny",
          "qwen2_moe_tiny"]
# Built here (no HF folder is committed for it; only its GGUF): a tiny Qwen2-MoE made by transformers like the others.
BUILT_HERE = {"qwen2_moe_tiny"}
OUT = ROOT / "tests/data/gguf_moe"
N_PROMPTS, N_NEW = 8, 64
PROMPT_LENGTHS = [1, 3, 8, 15, 24, 32, 40, 57]  # with 64 new tokens, all stay under max_position_embeddings 256


def prompts() -> list[list[int]]:
    # BOS (1) then byte tokens (3..258), seeded: the same prompts for every model.
    rng = random.Random(37)
    return [[1] + [rng.randrange(3, 259) for _ in range(n - 1)] for n in PROMPT_LENGTHS]


def fetch_llama_cpp() -> None:
    if (LLAMA_CPP / "convert_hf_to_gguf.py").exists():
        return
    dl = Path("/tmp/dl")
    dl.mkdir(exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", f"llama-cpp-python=={SDIST_VERSION}", "--no-binary", ":all:",
                    "--no-deps", "-d", str(dl)], check=True)
    (dl / "sdist").mkdir(exist_ok=True)
    subprocess.run(["tar", "xzf", str(dl / f"llama_cpp_python-{SDIST_VERSION}.tar.gz"), "-C", str(dl / "sdist")], check=True)


def build_driver() -> Path:
    lib = LLAMA_BUILD / "bin/libllama.so"
    if not lib.exists():
        subprocess.run(["cmake", "-S", str(LLAMA_CPP), "-B", str(LLAMA_BUILD), "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
                        "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                        "-DCMAKE_BUILD_TYPE=Release"], check=True)
        subprocess.run(["cmake", "--build", str(LLAMA_BUILD), "-j2", "--target", "llama"], check=True)
    exe = LLAMA_BUILD / "bin/llamacpp_greedy"
    src = ROOT / "scripts/llamacpp_greedy.cpp"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["c++", "-O2", "-std=c++17", str(src), "-I", str(LLAMA_CPP / "include"), "-I",
                        str(LLAMA_CPP / "ggml/include"), "-L", str(LLAMA_BUILD / "bin"), "-lllama", "-lggml",
                        "-lggml-base", f"-Wl,-rpath,{LLAMA_BUILD / 'bin'}", "-o", str(exe)], check=True)
    return exe


def convert_one(src: str, out: str) -> None:
    """Runs llama.cpp's convert_hf_to_gguf.main() in this process with the adjustments of the module docstring."""
    sys.path.insert(0, str(LLAMA_CPP))
    sys.path.insert(1, str(LLAMA_CPP / "gguf-py"))
    import gguf  # noqa: E402  (llama.cpp's own copy)
    from gguf.constants import GGUFValueType, Keys  # noqa: E402
    from conversion import base as conv_base  # noqa: E402
    from conversion import deepseek as conv_deepseek  # noqa: E402

    original_pre = conv_base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer):
        try:
            return original_pre(self, tokenizer)
        except NotImplementedError:
            pre = json.loads((Path(self.dir_model) / "tokenizer.json").read_text()).get("pre_tokenizer") or {}
            if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
                return "gpt-2"
            raise

    conv_base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    original_pack = gguf.GGUFWriter._pack_val

    def pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == GGUFValueType.ARRAY and sub_type is not None and len(val) == 0:
            data = bytearray(self._pack("I", vtype) if add_vtype else b"")
            data += self._pack("I", sub_type) + self._pack("Q", 0)
            return bytes(data)
        return original_pack(self, val, vtype, add_vtype, sub_type)

    gguf.GGUFWriter._pack_val = pack_val

    original_vocab = conv_base.TextModel._set_vocab_gpt2

    def set_vocab_gpt2(self):
        original_vocab(self)
        if not any(Keys.Tokenizer.MERGES in kv for kv in self.gguf_writer.kv_data):
            self.gguf_writer.add_key_value(Keys.Tokenizer.MERGES, [], GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)

    conv_base.TextModel._set_vocab_gpt2 = set_vocab_gpt2

    original_params = conv_deepseek.DeepseekV2Model.set_gguf_parameters

    def set_gguf_parameters(self):
        original_params(self)
        if self.hparams.get("q_lora_rank") is None:
            self.gguf_writer.add_q_lora_rank(0)

    conv_deepseek.DeepseekV2Model.set_gguf_parameters = set_gguf_parameters

    sys.argv = ["convert_hf_to_gguf.py", src, "--outtype", "f32", "--outfile", out]
    import convert_hf_to_gguf  # noqa: E402
    convert_hf_to_gguf.main()


def build_qwen2_moe(d: Path) -> None:
    """A tiny Qwen2-MoE the way scripts/gen_moe_goldens.py makes the others (seeded transformers model, random norms and
    embeddings, byte-level tokenizer), plus random q/k/v biases (transformers starts them at zero, which would hide a
    loader that drops them): 2 layers, 8 experts softmax top-2 without renormalisation (norm_topk_prob false, as
    Qwen1.5-MoE), a 48-wide shared expert behind its sigmoid gate, GQA 4/2."""
    import torch
    import transformers
    sys.path.insert(0, str(ROOT / "scripts"))
    import gen_moe_goldens as g
    cfg = transformers.Qwen2MoeConfig(
        **g.COMMON, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=False, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        decoder_sparse_step=1, mlp_only_layers=[], rms_norm_eps=1e-6, sliding_window=None, use_sliding_window=False,
        qkv_bias=True, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    model = g.build("Qwen2MoeForCausalLM", cfg, 107)
    gen = torch.Generator().manual_seed(1107)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    g.save_plain(model, str(d))


def convert(model: str, work: Path) -> Path:
    if model in BUILT_HERE:
        src = work / (model + "_hf")
        subprocess.run([sys.executable, __file__, "--build-qwen2-moe", str(src)], check=True)
    else:
        src = ROOT / "tests/data/hf_models" / model
    copy = work / model
    copy.mkdir()
    for f in src.iterdir():
        (copy / f.name).symlink_to(f)
    config = json.loads((src / "config.json").read_text())
    if config["model_type"] == "deepseek_v3" and "scoring_func" not in config:
        config["scoring_func"] = "sigmoid"
        (copy / "config.json").unlink()
        (copy / "config.json").write_text(json.dumps(config, indent=2))
    out = OUT / f"{model}.gguf"
    subprocess.run([sys.executable, __file__, "--convert-one", str(copy), str(out)], check=True,
                   stdout=subprocess.DEVNULL)
    return out


def greedy(exe: Path, gguf_path: Path, ps: list[list[int]]) -> list[dict]:
    text = "".join(" ".join(map(str, p)) + "\n" for p in ps)
    res = subprocess.run([str(exe), str(gguf_path), str(N_NEW)], input=text, capture_output=True, text=True, check=True)
    rows = []
    for prompt, line in zip(ps, res.stdout.strip().split("\n")):
        ids_part, margins_part = line.split("|")
        ids = [int(t) for t in ids_part.split()[1:]]
        margins = [float(m) for m in margins_part.split()[1:]]
        assert len(ids) == N_NEW and len(margins) == N_NEW, line
        rows.append({"prompt": prompt, "ids": ids, "margins": margins})
    return rows


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--convert-one":
        convert_one(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--build-qwen2-moe":
        build_qwen2_moe(Path(sys.argv[2]))
        return
    fetch_llama_cpp()
    exe = build_driver()
    OUT.mkdir(parents=True, exist_ok=True)
    ps = prompts()
    doc = {
        "reference": f"llama.cpp vendored in llama-cpp-python {SDIST_VERSION} (sdist): convert_hf_to_gguf.py --outtype f32, "
                     "then the llama library with greedy sampling, f32 K/V cache, flash attention off (scripts/gen_gguf_moe_goldens.py)",
        "n_new": N_NEW,
        "models": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            path = convert(model, Path(tmp))
            doc["models"][model] = greedy(exe, path, ps)
            print(f"{model}: {path.stat().st_size} bytes, min margin "
                  f"{min(min(r['margins']) for r in doc['models'][model]):.3g}")
    (OUT / "greedy.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
