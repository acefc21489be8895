"""Soak: 2,000 streaming requests (64 at a time) against `servetune serve` on stories260K, a third of them
abandoned by their client at a random point (mid-body, before the headers, after a few chunks). Completed streams
must be well-formed and end with [DONE]; afterwards /metrics must show no running or waiting request, no request
in flight and no KV block in use, with a handful of server threads. Standard library only (asyncio sockets)."""
import asyncio
import json
import random
import resource
import sys

import harness

NUM_REQUESTS = 2000
CONCURRENCY = 64
PROMPTS = ["Once upon a time", "The little dog", "Lily and Tom went to the park.", "One day, a big bird", "Sam had a red ball"]


async def read_chunked_sse(reader):
    """Yields the SSE payloads of a chunked text/event-stream body."""
    buf = b""
    while True:
        size = int((await reader.readline()).strip(), 16)
        if size == 0:
            await reader.readline()
            return
        buf += await reader.readexactly(size)
        await reader.readexactly(2)
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            assert event.startswith(b"data: "), event
            yield event[6:]


async def one_request(port, rng, stats):
    max_tokens = rng.randint(4, 48)
    body = json.dumps({"model": "test-model", "prompt": rng.choice(PROMPTS), "max_tokens": max_tokens, "ignore_eos": True,
                       "temperature": rng.choice([0, 0.8]), "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
    mode = rng.choices(["full", "mid_body", "after_send", "after_chunks"], weights=[66, 6, 10, 18])[0]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if mode == "mid_body":
            writer.write(head + body[: len(body) // 2])
            await writer.drain()
            stats["abandoned"] += 1
            return
        writer.write(head + body)
        await writer.drain()
        if mode == "after_send":
            stats["abandoned"] += 1
            return
        status = (await reader.readline()).split()[1]
        assert status == b"200", status
        while (await reader.readline()) not in (b"\r\n", b""):
            pass
        keep = rng.randint(0, 5)
        chunks, usage, done, finish = 0, None, False, None
        async for payload in read_chunked_sse(reader):
            if payload == b"[DONE]":
                done = True
                continue
            event = json.loads(payload)
            assert "error" not in event, event
            if event["choices"]:
                chunks += 1
                finish = event["choices"][0]["finish_reason"] or finish
            if event.get("usage"):
                usage = event["usage"]
            if mode == "after_chunks" and chunks >= keep:
                stats["abandoned"] += 1
                return
        assert done, "no [DONE]"
        assert finish == "length", finish
        assert usage and usage["completion_tokens"] == max_tokens, (usage, max_tokens)
        stats["completed"] += 1
    finally:
        writer.close()


async def run(port):
    rng = random.Random(1234)
    stats = {"completed": 0, "abandoned": 0}
    sem = asyncio.Semaphore(CONCURRENCY)

    async def guarded(i):
        async with sem:
            await one_request(port, random.Random(rng.random() + i), stats)

    await asyncio.gather(*(guarded(i) for i in range(NUM_REQUESTS)))
    return stats


def main():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    with harness.Server(harness.STORIES) as s:
        stats = asyncio.run(run(s.port))
        harness.check(stats["completed"] + stats["abandoned"] == NUM_REQUESTS, stats)
        harness.check(stats["abandoned"] > 300, stats)
        m = s.wait_idle()
        for key in ("vllm:num_requests_running", "vllm:num_requests_waiting", "servetune:kv_blocks_used",
                    "servetune:requests_in_flight", "servetune:http_connections"):
            harness.check(m[key] == 0 or (key == "servetune:http_connections" and m[key] <= 1), f"{key} = {m[key]} after the soak")
        threads = s.threads()
        print(f"soak: {stats}; server threads {threads}; engine aborted {m['servetune:engine_requests_aborted_total']:.0f}; "
              f"generation tokens {m['vllm:generation_tokens_total']:.0f}", flush=True)
        harness.check(m["servetune:engine_requests_aborted_total"] > 0, m)
    print("ok")


if __name__ == "__main__":
    main()
    sys.exit(0)
