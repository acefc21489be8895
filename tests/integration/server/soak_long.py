"""Long soak (not in CI's default run): DURATION seconds (default 1800) of mixed traffic against `servetune serve` on
SmolLM2 (stories260K, without chat, when SmolLM2 is not fetched) at twice the server's running-request limit: streaming completions abandoned at random points (the
2,000-request soak's client, test_soak.py), non-streaming completions with n = 2, chat, and bad requests (malformed
JSON, a number beyond a double, an unknown field type) that must get 400. Afterwards: no request running, waiting or
in flight, no KV block in use, no file descriptor leaked, and the resident memory compared with a warm-up sample.
  tests/integration/server/run_python.sh tests/integration/server/soak_long.py build/cpu/servetune [DURATION]"""
import asyncio
import json
import os
import random
import resource
import sys
import time

import harness
from test_soak import one_request

MAX_RUNNING = 16
CHAT = True  # False for a model without a chat template
CONCURRENCY = 2 * MAX_RUNNING
BAD_BODIES = [b"{not json", b'{"model": "test-model", "prompt": "x", "max_tokens": 1e400}',
              b'{"model": "test-model", "prompt": ["x", 3], "max_tokens": "many"}']


async def http(port, method, path, body):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write((f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode() + body)
        await writer.drain()
        status = int((await reader.readline()).split()[1])
        rest = await reader.read()
        return status, rest.split(b"\r\n\r\n", 1)[1] if b"\r\n\r\n" in rest else b""
    finally:
        writer.close()


async def mixed_request(port, rng, stats):
    kind = rng.choices(["stream", "choices", "chat", "bad"], weights=[70, 12, 12, 6])[0]
    if kind == "chat" and not CHAT:
        kind = "stream"
    if kind == "stream":
        await one_request(port, rng, stats)
        return
    if kind == "bad":
        status, _ = await http(port, "POST", "/v1/completions", rng.choice(BAD_BODIES))
        assert status == 400, status
        stats["bad"] += 1
        return
    if kind == "choices":
        body = {"model": "test-model", "prompt": "Once upon a time", "max_tokens": rng.randint(4, 32), "n": 2,
                "ignore_eos": True, "temperature": 0.8}
        status, data = await http(port, "POST", "/v1/completions", json.dumps(body).encode())
    else:
        body = {"model": "test-model", "messages": [{"role": "user", "content": "Tell me a story"}],
                "max_tokens": rng.randint(4, 32)}
        status, data = await http(port, "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert status == 200, (status, data[:200])
    stats[kind] += 1


async def run(port, seconds):
    rng = random.Random(4321)
    stats = {"completed": 0, "abandoned": 0, "choices": 0, "chat": 0, "bad": 0}
    deadline = time.time() + seconds

    async def worker(w):
        i = 0
        while time.time() < deadline:
            await mixed_request(port, random.Random(w * 1_000_003 + i), stats)
            i += 1

    await asyncio.gather(*(worker(w) for w in range(CONCURRENCY)))
    return stats


def main():
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 1800.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    global CHAT
    model = harness.smollm2_or_none()
    CHAT = model is not None
    with harness.Server(model or harness.STORIES, "--max-running-requests", str(MAX_RUNNING)) as s:
        warm = asyncio.run(run(s.port, min(30.0, seconds / 10)))  # allocations settle before the first sample
        s.wait_idle()
        rss0, fds0 = s.status("VmRSS"), len(os.listdir(f"/proc/{s.proc.pid}/fd"))
        t0 = time.time()
        stats = asyncio.run(run(s.port, seconds))
        elapsed = time.time() - t0
        m = s.wait_idle()
        rss1, fds1 = s.status("VmRSS"), len(os.listdir(f"/proc/{s.proc.pid}/fd"))
        for key in ("vllm:num_requests_running", "vllm:num_requests_waiting", "servetune:kv_blocks_used",
                    "servetune:requests_in_flight"):
            harness.check(m[key] == 0, f"{key} = {m[key]} after the soak")
        harness.check(fds1 <= fds0 + 1, f"file descriptors {fds0} -> {fds1}")
        total = sum(stats.values())
        print(f"soak_long: {os.path.basename(model or harness.STORIES)}, {elapsed:.0f} s, {total} requests ({total / elapsed:.1f}/s) at concurrency {CONCURRENCY}: "
              f"{stats}; warm-up {sum(warm.values())} requests; RSS {rss0} -> {rss1} KiB "
              f"({(rss1 - rss0) / max(rss0, 1) * 100:+.1f}%); fds {fds0} -> {fds1}; server threads {s.threads()}; "
              f"engine aborted {m['servetune:engine_requests_aborted_total']:.0f}", flush=True)
        harness.check(rss1 <= rss0 * 1.10 + 4096, f"RSS grew from {rss0} to {rss1} KiB")
    print("ok")


if __name__ == "__main__":
    main()
    sys.exit(0)
