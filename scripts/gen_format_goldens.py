#!/usr/bin/env python3
"""Generates the safetensors and HF config.json goldens under tests/data/ with the reference packages.

Usage: python3 scripts/gen_format_goldens.py
Needs: pip install safetensors==0.8.0 numpy transformers==5.24.0 (transformers needs no torch for configs).

tests/data/safetensors/
  python_written.safetensors       written by safetensors.serialize (every dtype servetune maps, a scalar, an
                                   empty tensor, metadata); python_written.expected.json lists each tensor's
                                   dtype, shape, data_offsets and data (hex) as safetensors.deserialize reads them
  sharded/                         two shards + model.safetensors.index.json (transformers' layout)
tests/data/hf_config/
  <name>.json                      config.json files (published models' keys and values, transformers-5 written
                                   ones, and servetune_written_*.json produced by servetune's writer)
  <name>.expected.json             the values transformers' AutoConfig reads from each, in HfModelConfig's terms
tests/fuzz/corpus/safetensors/     seed corpus for fuzz_safetensors
"""

import json
import os
import shutil
import sys
from importlib.metadata import version

import numpy as np
from safetensors import TensorSpec, deserialize, serialize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ST_DIR = os.path.join(ROOT, "tests", "data", "safetensors")
CFG_DIR = os.path.join(ROOT, "tests", "data", "hf_config")
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus", "safetensors")

# (name, safetensors TensorSpec dtype, shape, numpy dtype to make the bytes)
TENSORS = [
    ("model.embed_tokens.weight", "float32", [4, 3], np.float32),
    ("model.norm.weight", "float16", [3], np.float16),
    ("lm_head.weight", "bfloat16", [2, 3], np.uint16),
    ("positions", "int64", [3], np.int64),
    ("rope.inv_freq", "float64", [2], np.float64),
    ("mask", "int8", [5], np.int8),
    ("short_ids", "int16", [2], np.int16),
    ("ids", "int32", [2, 2], np.int32),
    ("kv_scale_fp8", "float8_e4m3fn", [4], np.uint8),
    ("temperature", "float32", [], np.float32),
    ("empty", "float32", [0, 4], np.float32),
]


def tensor_bytes(i: int, shape: list[int], np_dtype) -> bytes:
    n = int(np.prod(shape)) if shape else 1
    if np_dtype in (np.float32, np.float16, np.float64):
        return (np.arange(n, dtype=np.float64) * 0.5 - i).astype(np_dtype).tobytes()
    if np_dtype == np.uint16:  # bfloat16 bit patterns of 1.0, -2.0, 0.5, ...
        return np.array([0x3F80, 0xC000, 0x3F00, 0x4040, 0xBF80, 0x0000][:n], dtype=np.uint16).tobytes()
    if np_dtype == np.uint8:  # fp8 e4m3 codes of 1.0, -1.0, 448, 2^-9
        return np.array([0x38, 0xB8, 0x7E, 0x01][:n], dtype=np.uint8).tobytes()
    return (np.arange(n, dtype=np.int64) * 37 - 50 * (i % 3)).astype(np_dtype).tobytes()


def st_serialize(tensors: dict[str, tuple[str, list[int], bytes]], metadata) -> bytes:
    buffers, specs = [], {}
    for name, (dtype, shape, data) in tensors.items():
        buf = np.frombuffer(data, dtype=np.uint8).copy() if data else np.zeros(1, dtype=np.uint8)
        buffers.append(buf)
        specs[name] = TensorSpec(dtype=dtype, shape=shape, data_ptr=buf.ctypes.data, data_len=len(data))
    return bytes(serialize(specs, metadata=metadata))


def raw(header: bytes, data_len: int) -> bytes:
    """A hand-made file: length prefix, header, zero data."""
    return len(header).to_bytes(8, "little") + header + bytes(data_len)


def write_bytes(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def gen_safetensors() -> None:
    tensors = {name: (dt, shape, tensor_bytes(i, shape, npd)) for i, (name, dt, shape, npd) in enumerate(TENSORS)}
    blob = st_serialize(tensors, {"format": "pt"})
    write_bytes(os.path.join(ST_DIR, "python_written.safetensors"), blob)
    header_len = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + header_len])
    expected = {"safetensors_version": version("safetensors"), "metadata": header["__metadata__"], "tensors": []}
    for name, info in deserialize(blob):
        entry = header[name]
        expected["tensors"].append({"name": name, "dtype": info["dtype"], "shape": info["shape"],
                                    "data_offsets": entry["data_offsets"], "data": bytes(info["data"]).hex()})
    expected["tensors"].sort(key=lambda t: t["data_offsets"])
    with open(os.path.join(ST_DIR, "python_written.expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")

    # Two shards and an index as transformers' save_pretrained lays them out.
    shard_dir = os.path.join(ST_DIR, "sharded")
    shutil.rmtree(shard_dir, ignore_errors=True)
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:5], "model-00002-of-00002.safetensors": names[5:]}
    weight_map, total = {}, 0
    for shard, members in shards.items():
        write_bytes(os.path.join(shard_dir, shard), st_serialize({n: tensors[n] for n in members}, {"format": "pt"}))
        for n in members:
            weight_map[n] = shard
            total += len(tensors[n][2])
    with open(os.path.join(shard_dir, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")

    # Fuzz seeds: valid files plus edge cases the parser must reject cleanly.
    shutil.rmtree(CORPUS, ignore_errors=True)
    os.makedirs(CORPUS)
    seeds = {
        "python_written": blob,
        "shard2": open(os.path.join(shard_dir, "model-00002-of-00002.safetensors"), "rb").read(),
        "empty": st_serialize({}, None),
        "metadata_only": st_serialize({}, {"format": "np"}),  # one key: the reference orders several randomly
        "one_f32": st_serialize({"w": ("float32", [2, 2], np.ones(4, np.float32).tobytes())}, None),
        "truncated": blob[:-3],
        "header_too_long": (10**9).to_bytes(8, "little") + b"{}",
        "gap": raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),
        "overlap": raw(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                       b'"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),
        "overflow": raw(b'{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}', 8),
        "bad_dtype": raw(b'{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"__metadata__":{"k":"v"}}', 4),
    }
    for name, data in seeds.items():
        write_bytes(os.path.join(CORPUS, name + ".safetensors"), data)
    print(f"safetensors: {len(tensors)} tensors, 2 shards, {len(seeds)} fuzz seeds")


# Configs with the keys and values of published models' config.json (SmolLM2's values match the GGUF metadata
# of models/SmolLM2-135M-Instruct.Q4_1.gguf).
PUBLISHED = {
    "smollm2_135m_instruct": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
        "intermediate_size": 1536, "is_llama_config": True, "max_position_embeddings": 8192, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3,
        "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False,
        "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 49152,
    },
    "llama3_2_1b_instruct": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
        "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
        "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
        "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
    },
    "qwen2_5_0_5b_instruct": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
        "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936,
    },
    "mistral_7b_v0_1": {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000,
    },
}


def transformers_written() -> dict[str, str]:
    """Configs written by transformers 5 itself (rope_parameters, dtype keys)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config
    made = {
        "tiny_llama_linear_v5": LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                            max_position_embeddings=256, rms_norm_eps=1e-5,
                                            rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                             "rope_theta": 20000.0},
                                            tie_word_embeddings=True, dtype="float32",
                                            architectures=["LlamaForCausalLM"]),
        "tiny_mistral_v5": MistralConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                                         num_attention_heads=8, num_key_value_heads=4, head_dim=32, vocab_size=1000,
                                         sliding_window=None, architectures=["MistralForCausalLM"]),
        "tiny_qwen2_v5": Qwen2Config(hidden_size=96, intermediate_size=200, num_hidden_layers=2,
                                     num_attention_heads=6, num_key_value_heads=2, vocab_size=300,
                                     eos_token_id=[5, 6], architectures=["Qwen2ForCausalLM"]),
    }
    return {name: cfg.to_json_string() for name, cfg in made.items()}


def interpret(path: str) -> dict:
    """What transformers reads from a config.json, in HfModelConfig's field names."""
    from transformers import AutoConfig
    c = AutoConfig.from_pretrained(path)
    rope = dict(c.rope_parameters or {})
    rtype = rope.get("rope_type", "default")
    ids = lambda v: [] if v is None else (list(v) if isinstance(v, (list, tuple)) else [v])
    sliding = getattr(c, "sliding_window", None) if c.model_type == "mistral" else None
    dtype = getattr(c, "dtype", None)
    return {
        "architecture": (c.architectures or [None])[0],
        "model_type": c.model_type,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": c.max_position_embeddings,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_theta": float(rope["rope_theta"]),
        "rope_type": {"default": "none"}.get(rtype, rtype),
        "rope_factor": float(rope.get("factor", 1.0)),
        "rope_low_freq_factor": float(rope.get("low_freq_factor", 1.0)),
        "rope_high_freq_factor": float(rope.get("high_freq_factor", 4.0)),
        "rope_original_max_position_embeddings": int(rope.get("original_max_position_embeddings", 0)),
        "tie_word_embeddings": bool(c.tie_word_embeddings),
        "attention_bias": True if c.model_type == "qwen2" else bool(getattr(c, "attention_bias", False)),
        "mlp_bias": bool(getattr(c, "mlp_bias", False)) if c.model_type == "llama" else False,
        "sliding_window": sliding,
        "torch_dtype": "" if dtype is None else str(dtype).replace("torch.", ""),
        "bos_token_id": ids(c.bos_token_id),
        "eos_token_id": ids(c.eos_token_id),
    }


def gen_hf_configs() -> None:
    import tempfile
    os.makedirs(CFG_DIR, exist_ok=True)
    for name, cfg in PUBLISHED.items():
        with open(os.path.join(CFG_DIR, name + ".json"), "w") as f:
            f.write(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for name, text in transformers_written().items():
        with open(os.path.join(CFG_DIR, name + ".json"), "w") as f:
            f.write(text)
    names = sorted(n[:-5] for n in os.listdir(CFG_DIR) if n.endswith(".json") and not n.endswith(".expected.json"))
    for name in names:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(CFG_DIR, name + ".json"), os.path.join(tmp, "config.json"))
            expected = interpret(tmp)
        expected["transformers_version"] = version("transformers")
        with open(os.path.join(CFG_DIR, name + ".expected.json"), "w") as f:
            f.write(json.dumps(expected, indent=2, sort_keys=True) + "\n")
    print(f"hf_config: {len(names)} configs interpreted by transformers {version('transformers')}")


def main() -> int:
    gen_safetensors()
    gen_hf_configs()
    return 0


if __name__ == "__main__":
    sys.exit(main())
