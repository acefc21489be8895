"""Greedy output through HTTP equals `servetune generate --json` (the in-process engine) for the same prompt:
same prompt token ids (control-token text included), same text, same number of output tokens, same finish reason. Completions on stories260K,
completions and chat on SmolLM2-135M-Instruct when fetched. Standard library only."""
import sys

import harness

# Text spelling a control token ("<s>", ChatML's markers) is that token in both (`generate --prompt` parses it as the
# completions endpoint does).
STORY_PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park. They", "<s>Once upon a time"]
SMOL_PROMPTS = ["The capital of France is", "def fibonacci(n):",
                "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"]
SMOL_CHATS = ["What is 2 + 2?", "Write a haiku about the sea."]


def compare_completion(server, model, prompt, max_tokens):
    ref = harness.generate_json(model, "--prompt", prompt, "--max-tokens", str(max_tokens))
    status, tok = server.post_json("/tokenize", {"prompt": prompt})
    harness.check(status == 200 and tok["tokens"] == ref["prompt_ids"], f"prompt ids differ: {tok} vs {ref['prompt_ids']}")
    status, r = server.post_json("/v1/completions", {"model": server.name, "prompt": prompt, "max_tokens": max_tokens,
                                                     "temperature": 0})
    harness.check(status == 200, r)
    c = r["choices"][0]
    harness.check(c["text"] == ref["text"], f"{prompt!r}: HTTP {c['text']!r} != generate {ref['text']!r}")
    harness.check(r["usage"]["completion_tokens"] == len(ref["output_ids"]), (r["usage"], len(ref["output_ids"])))
    harness.check(r["usage"]["prompt_tokens"] == len(ref["prompt_ids"]), r["usage"])
    harness.check(c["finish_reason"] == ref["finish_reason"], (c["finish_reason"], ref["finish_reason"]))


def compare_chat(server, model, message, max_tokens):
    ref = harness.generate_json(model, "--chat", message, "--max-tokens", str(max_tokens))
    status, r = server.post_json("/v1/chat/completions", {"model": server.name, "max_tokens": max_tokens, "temperature": 0,
                                                          "messages": [{"role": "user", "content": message}]})
    harness.check(status == 200, r)
    c = r["choices"][0]
    harness.check(c["message"]["content"] == ref["text"], f"{message!r}: HTTP {c['message']['content']!r} != {ref['text']!r}")
    harness.check(r["usage"]["prompt_tokens"] == len(ref["prompt_ids"]), (r["usage"], len(ref["prompt_ids"])))
    harness.check(r["usage"]["completion_tokens"] == len(ref["output_ids"]), r["usage"])
    harness.check(c["finish_reason"] == ref["finish_reason"], (c["finish_reason"], ref["finish_reason"]))


def main():
    with harness.Server(harness.STORIES) as s:
        for p in STORY_PROMPTS:
            compare_completion(s, harness.STORIES, p, 80)
    smol = harness.smollm2_or_none()
    if smol:
        with harness.Server(smol) as s:
            for p in SMOL_PROMPTS:
                compare_completion(s, smol, p, 32)
            for m in SMOL_CHATS:
                compare_chat(s, smol, m, 32)
    print("ok")


if __name__ == "__main__":
    main()
    sys.exit(0)
