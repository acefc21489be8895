"""The official `openai` Python client against `servetune serve`: completions and chat completions, streaming and
not, usage (also stream_options.include_usage), logprobs, n > 1 choices, models, and the client's typed errors for
400 / 401 / 404. stories260K always; SmolLM2-135M-Instruct (chat template) when fetched."""
import sys

import harness

try:
    import openai
except ImportError:
    harness.skip("the `openai` package is not importable (pip install openai; scripts/setup.sh puts it in .venv)")


def client(server, key="unused"):
    return openai.OpenAI(base_url=server.base + "/v1", api_key=key, max_retries=0, timeout=120)


def expect_error(cls, fn, needle=""):
    try:
        fn()
    except cls as e:
        harness.check(needle in str(e), f"{cls.__name__} without '{needle}': {e}")
        return e
    raise AssertionError(f"expected {cls.__name__}")


def completions(server):
    c = client(server)
    r = c.completions.create(model=server.name, prompt="Once upon a time", max_tokens=24, temperature=0)
    harness.check(r.object == "text_completion" and r.model == server.name and r.id.startswith("cmpl-"), r)
    ch = r.choices[0]
    harness.check(ch.index == 0 and ch.finish_reason in ("length", "stop") and ch.text, r)
    harness.check(r.usage.completion_tokens == 24 or ch.finish_reason == "stop", r.usage)
    harness.check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, r.usage)

    text, finish, usage, chunks = "", None, None, 0
    for chunk in c.completions.create(model=server.name, prompt="Once upon a time", max_tokens=24, temperature=0,
                                      stream=True, stream_options={"include_usage": True}):
        harness.check(chunk.object == "text_completion" and chunk.id.startswith("cmpl-"), chunk)
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
            chunks += 1
        if chunk.usage:
            usage = chunk.usage
    harness.check(text == ch.text, f"streamed {text!r} != {ch.text!r}")
    harness.check(finish == ch.finish_reason, finish)
    harness.check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, usage)
    harness.check(chunks >= 2, chunks)

    # Token-id prompt, list-of-one prompt, stop string, seed, logprobs.
    ids = server.post_json("/tokenize", {"prompt": "Once upon a time"})[1]["tokens"]
    r2 = c.completions.create(model=server.name, prompt=ids, max_tokens=24, temperature=0)
    harness.check(r2.choices[0].text == ch.text, (r2.choices[0].text, ch.text))
    r3 = c.completions.create(model=server.name, prompt=["Once upon a time"], max_tokens=24, temperature=0)
    harness.check(r3.choices[0].text == ch.text, r3)
    words = ch.text.split()
    if len(words) > 3:
        r4 = c.completions.create(model=server.name, prompt="Once upon a time", max_tokens=24, temperature=0, stop=[words[3]])
        harness.check(r4.choices[0].finish_reason == "stop" and words[3] not in r4.choices[0].text, r4)
    s1 = c.completions.create(model=server.name, prompt="Once", max_tokens=16, temperature=1.0, seed=7)
    s2 = c.completions.create(model=server.name, prompt="Once", max_tokens=16, temperature=1.0, seed=7)
    harness.check(s1.choices[0].text == s2.choices[0].text, "same seed, different text")
    lp = c.completions.create(model=server.name, prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=2)
    l = lp.choices[0].logprobs
    harness.check(len(l.tokens) == 5 and len(l.token_logprobs) == 5 and len(l.top_logprobs) == 5, l)
    harness.check(all(v <= 0 for v in l.token_logprobs), l)
    # vLLM's extensions travel in extra_body.
    r5 = c.completions.create(model=server.name, prompt="Once", max_tokens=30,
                              extra_body={"min_tokens": 30, "ignore_eos": True, "top_k": 5, "min_p": 0.01,
                                          "repetition_penalty": 1.1})
    harness.check(r5.usage.completion_tokens == 30, r5.usage)

    models = c.models.list()
    harness.check([m.id for m in models.data] == [server.name], models)
    expect_error(openai.NotFoundError, lambda: c.completions.create(model="gpt-4", prompt="x", max_tokens=2), "does not exist")
    expect_error(openai.BadRequestError, lambda: c.completions.create(model=server.name, prompt="x", max_tokens=0), "max_tokens")
    expect_error(openai.BadRequestError, lambda: c.completions.create(model=server.name, prompt=["a", "b"], max_tokens=2), "batched")
    expect_error(openai.BadRequestError, lambda: c.completions.create(model=server.name, prompt="x", max_tokens=10**6), "context length")
    expect_error(openai.BadRequestError, lambda: c.completions.create(model=server.name, prompt="x", temperature=-1), "temperature")
    expect_error(openai.BadRequestError, lambda: c.completions.create(model=server.name, prompt="x", n=2, best_of=3), "best_of")
    several_choices(c, server, chat=False)


def streamed_choices(stream, chat):
    """Texts and finish reasons by choice index, and the final usage, of a streamed response."""
    texts, finish, usage = {}, {}, None
    for chunk in stream:
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ((ch.delta.content or "") if chat else ch.text)
            finish[ch.index] = ch.finish_reason or finish.get(ch.index)
        if chunk.usage:
            usage = chunk.usage
    return texts, finish, usage


def several_choices(c, server, chat):
    """n = 3: choices 0..2, each its own sample (seeded: choice i draws as seed + i), usage with the prompt counted once
    and every choice's tokens; the stream carries the same choices."""
    if chat:
        create = c.chat.completions.create
        args = dict(messages=[{"role": "user", "content": "Tell me a story."}])
    else:
        create = c.completions.create
        args = dict(prompt="Once upon a time")
    args.update(model=server.name, max_tokens=10, temperature=1.0, extra_body={"ignore_eos": True})
    text_of = (lambda ch: ch.message.content) if chat else (lambda ch: ch.text)
    r = create(n=3, seed=11, **args)
    harness.check([ch.index for ch in r.choices] == [0, 1, 2], r)
    harness.check(all(ch.finish_reason == "length" for ch in r.choices), r)
    harness.check(r.usage.completion_tokens == 30, r.usage)
    texts = [text_of(ch) for ch in r.choices]
    harness.check(len(set(texts)) > 1, texts)
    one = create(seed=12, **args)
    harness.check(text_of(one.choices[0]) == texts[1], (text_of(one.choices[0]), texts[1]))
    harness.check(one.usage.prompt_tokens == r.usage.prompt_tokens, (one.usage, r.usage))
    streamed, finish, usage = streamed_choices(create(n=3, seed=11, stream=True, stream_options={"include_usage": True},
                                                      **args), chat)
    harness.check([streamed.get(i) for i in range(3)] == texts, (streamed, texts))
    harness.check(all(finish.get(i) == "length" for i in range(3)), finish)
    harness.check(usage is not None and usage.completion_tokens == 30 and usage.prompt_tokens == r.usage.prompt_tokens, usage)


def chat(server):
    c = client(server)
    msgs = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "What is the capital of France?"}]
    r = c.chat.completions.create(model=server.name, messages=msgs, max_tokens=20, temperature=0)
    harness.check(r.object == "chat.completion" and r.id.startswith("chatcmpl-"), r)
    m = r.choices[0].message
    harness.check(m.role == "assistant" and m.content, r)
    harness.check(r.usage.prompt_tokens > 10 and r.usage.completion_tokens > 0, r.usage)

    text, role, usage, finish = "", None, None, None
    for chunk in c.chat.completions.create(model=server.name, messages=msgs, max_completion_tokens=20, temperature=0,
                                           stream=True, stream_options={"include_usage": True}):
        harness.check(chunk.object == "chat.completion.chunk", chunk)
        if chunk.choices:
            d = chunk.choices[0].delta
            role = d.role or role
            text += d.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    harness.check(role == "assistant", role)
    harness.check(text == m.content, f"streamed {text!r} != {m.content!r}")
    harness.check(finish == r.choices[0].finish_reason, finish)
    harness.check(usage.prompt_tokens == r.usage.prompt_tokens and usage.completion_tokens == r.usage.completion_tokens, usage)

    lp = c.chat.completions.create(model=server.name, messages=msgs, max_tokens=4, temperature=0, logprobs=True, top_logprobs=3)
    content = lp.choices[0].logprobs.content
    harness.check(len(content) == lp.usage.completion_tokens and all(len(t.top_logprobs) == 3 for t in content), content)
    harness.check(content[0].top_logprobs[0].logprob >= content[0].top_logprobs[1].logprob, content[0])
    # Without max_tokens, chat may run to the end of the context (it stops at EOS here).
    r2 = c.chat.completions.create(model=server.name, messages=[{"role": "user", "content": "Say OK."}], temperature=0)
    harness.check(r2.choices[0].finish_reason in ("stop", "length"), r2)
    expect_error(openai.BadRequestError, lambda: c.chat.completions.create(
        model=server.name, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]),
        "image_url")
    several_choices(c, server, chat=True)


def auth():
    with harness.Server(harness.STORIES, "--api-key", "sekrit") as s:
        expect_error(openai.AuthenticationError, lambda: client(s, "wrong").models.list(), "API key")
        harness.check(client(s, "sekrit").models.list().data[0].id == s.name, "key accepted")
        harness.check(s.request("GET", "/health")[0] == 200, "health is open")


def main():
    with harness.Server(harness.STORIES) as s:
        completions(s)
        m = s.wait_idle()
        harness.check(m["servetune:kv_blocks_used"] == 0, m)
    auth()
    smol = harness.smollm2_or_none()
    if smol:
        with harness.Server(smol, name="smol") as s:
            completions(s)
            chat(s)
    print("ok")


if __name__ == "__main__":
    main()
    sys.exit(0)
