"""`servetune serve` as a process: bad flags exit 2 with one message, a taken port exits 1, SIGINT and SIGTERM shut
down gracefully (a stream in flight ends with a finish_reason and [DONE]; past --shutdown-timeout it is aborted)
and the process exits 0; /metrics carries vLLM's histograms after traffic; `servetune bench` against a speculating
server reports the server's speculative-decoding counters (scraped from /metrics before and after the run), and
none against a server that does not speculate. Standard library only."""
import http.client
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading

import harness


def run_cli(*args):
    return subprocess.run([harness.servetune_bin(), "serve", "--model", harness.STORIES, *args],
                          capture_output=True, text=True, timeout=120)


def stream_text(port, body, result):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    result["status"] = r.status
    result["body"] = r.read().decode()


def shutdown_during_stream(sig, timeout_s, max_tokens):
    with harness.Server(harness.STORIES, "--shutdown-timeout", str(timeout_s)) as s:
        result = {}
        t = threading.Thread(target=stream_text, args=(s.port, {"prompt": "Once upon a time", "max_tokens": max_tokens,
                                                                "ignore_eos": True, "stream": True}, result))
        t.start()
        for _ in range(100000):
            if s.metrics()["servetune:requests_in_flight"] >= 1:
                break
        s.proc.send_signal(sig)
        t.join()
        harness.check(result["status"] == 200, result)
        harness.check(result["body"].rstrip().endswith("data: [DONE]"), result["body"][-200:])
        finishes = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in result["body"].split("\n\n")
                    if e.startswith("data: {")]
        s.proc.wait(timeout=60)
        harness.check(s.proc.returncode == 0, f"exit {s.proc.returncode}:\n{s.output()}")
        return finishes[-1]


def bench_over_http(port, result_dir):
    r = subprocess.run([harness.servetune_bin(), "bench", "--backend", "openai", "--port", str(port), "--model", harness.STORIES,
                        "--served-model-name", "test-model", "--dataset-name", "random", "--random-input-len", "16",
                        "--random-output-len", "48", "--ignore-eos", "--num-prompts", "8", "--max-concurrency", "4",
                        "--save-result", "--result-dir", result_dir, "--result-filename", "r.json"],
                       capture_output=True, text=True, timeout=300)
    harness.check(r.returncode == 0, f"bench exit {r.returncode}: {r.stderr}")
    with open(os.path.join(result_dir, "r.json")) as f:
        return r.stdout, json.load(f)


def check_speculative_counters():
    with tempfile.TemporaryDirectory() as d:
        with harness.Server(harness.STORIES, "--speculative-algorithm", "ngram") as s:
            stdout, result = bench_over_http(s.port, d)
            server = s.metrics()
            harness.check("Speculative Decoding" in stdout, stdout)
            for key, counter in [("spec_decode_num_drafts", "vllm:spec_decode_num_drafts_total"),
                                 ("spec_decode_draft_tokens", "vllm:spec_decode_num_draft_tokens_total"),
                                 ("spec_decode_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_total")]:
                harness.check(result[key] == server[counter], f"{key} {result[key]} vs the server's {server[counter]}")
            harness.check(result["spec_decode_draft_tokens"] > 0, f"no drafts on stories260K: {result}")
        with harness.Server(harness.STORIES) as s:
            stdout, result = bench_over_http(s.port, d)
            harness.check("Speculative Decoding" not in stdout and "spec_decode_num_drafts" not in result, stdout)


def main():
    for args, needle in [(["--port", "70000"], "--port"), (["--host", "localhost:1"], "--host"),
                         (["--io-threads", "0"], "--io-threads"), (["--max-queued-requests", "-1"], "--max-queued-requests"),
                         (["--timeout-keep-alive", "0"], "--timeout-keep-alive"), (["--worker-threads", "0"], "--worker-threads")]:
        r = run_cli(*args)
        harness.check(r.returncode == 2 and needle in r.stderr, f"{args}: exit {r.returncode}, {r.stderr!r}")

    with harness.Server(harness.STORIES) as s:
        r = run_cli("--port", str(s.port))
        harness.check(r.returncode == 1 and "cannot listen" in r.stderr, f"port in use: exit {r.returncode}, {r.stderr!r}")
        for _ in range(3):
            status, _ = s.post_json("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True})
            harness.check(status == 200, status)
        _, _, text = s.request("GET", "/metrics")
        text = text.decode()
        for needle in ['vllm:time_to_first_token_seconds_count{model_name="test-model"} 3',
                       'vllm:e2e_request_latency_seconds_count{model_name="test-model"} 3',
                       'vllm:request_success_total{model_name="test-model",finished_reason="length"} 3',
                       'vllm:inter_token_latency_seconds_count{model_name="test-model"} 21']:
            harness.check(needle in text, f"missing {needle!r} in /metrics")

    # Within the grace period the stream finishes normally; past it, it is aborted. Either way: [DONE], exit 0.
    harness.check(shutdown_during_stream(signal.SIGINT, 60, 64) == "length", "SIGINT: the stream should finish")
    harness.check(shutdown_during_stream(signal.SIGTERM, 0.2, 2000) in ("abort", "length"), "SIGTERM")
    check_speculative_counters()
    print("ok")


if __name__ == "__main__":
    main()
    sys.exit(0)
