"""Shared helpers for the `servetune serve` integration tests: start the server on a free port, plain HTTP
requests (stdlib only), the SKIP convention (exit 77; a missing fetched model fails under
SERVETUNE_REQUIRE_MODELS=1), and a clean shutdown that must exit 0."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

SKIP = 77
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
STORIES = os.path.join(ROOT, "tests", "data", "stories260K.gguf")
SMOLLM2 = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


def require_fetched():
    return os.environ.get("SERVETUNE_REQUIRE_MODELS") == "1"


def skip(reason):
    """Skips the test (ctest SKIP_RETURN_CODE 77), or fails when CI requires everything to be present."""
    if require_fetched():
        print(f"FAIL: {reason} (SERVETUNE_REQUIRE_MODELS=1)", flush=True)
        sys.exit(1)
    print(f"SKIP: {reason}", flush=True)
    sys.exit(SKIP)


def smollm2_or_none():
    if os.path.exists(SMOLLM2):
        return SMOLLM2
    if require_fetched():
        print(f"FAIL: missing {SMOLLM2} (run scripts/setup.sh)", flush=True)
        sys.exit(1)
    print(f"note: {SMOLLM2} is missing; SmolLM2 cases skipped (run scripts/setup.sh)", flush=True)
    return None


def servetune_bin():
    if len(sys.argv) < 2:
        print("usage: test.py PATH/TO/servetune", flush=True)
        sys.exit(2)
    return sys.argv[1]


class Server:
    """`servetune serve` on a free port (--port 0; the port is read from its start-up line)."""

    def __init__(self, model, *args, name="test-model"):
        self.cmd = [servetune_bin(), "serve", "--model", model, "--port", "0", "--served-model-name", name, *args]
        self.name = name
        self.log_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"servetune-serve-{os.getpid()}-{id(self)}.log")
        self.log = open(self.log_path, "w+")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = None
        deadline = time.time() + 120
        while self.port is None:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.output()}")
            if time.time() > deadline:
                raise RuntimeError(f"server did not start:\n{self.output()}")
            m = re.search(r"listening on http://[^:]+:(\d+)", self.output())
            if m:
                self.port = int(m.group(1))
            else:
                time.sleep(0.05)
        self.base = f"http://127.0.0.1:{self.port}"

    def output(self):
        self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def request(self, method, path, body=None, headers=None, timeout=120):
        """Returns (status, headers dict, body bytes)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=data, headers=hdrs)
        r = conn.getresponse()
        out = (r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
        conn.close()
        return out

    def post_json(self, path, body, headers=None):
        status, _, data = self.request("POST", path, body, headers)
        return status, json.loads(data) if data else None

    def metrics(self):
        status, _, data = self.request("GET", "/metrics")
        assert status == 200, status
        values = {}
        for line in data.decode().splitlines():
            if line.startswith("#") or not line:
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if name_labels.endswith("}") and "le=" not in name_labels and "status=" not in name_labels and "finished_reason=" not in name_labels:
                values[name] = float(value)
        return values

    def wait_idle(self, timeout=60):
        """Waits until the engine holds no request and no KV block; returns the last metrics."""
        deadline = time.time() + timeout
        m = self.metrics()
        while time.time() < deadline:
            m = self.metrics()
            if (m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
                    and m["servetune:kv_blocks_used"] == 0 and m["servetune:requests_in_flight"] == 0):
                return m
            time.sleep(0.05)
        return m

    def status(self, field):
        """A number from the server's /proc/PID/status ("Threads", "VmRSS" in KiB); -1 when absent."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        return -1

    def threads(self):
        return self.status("Threads")

    def stop(self):
        """SIGTERM; the server must exit 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server did not exit after SIGTERM:\n{self.output()}")
        rc = self.proc.returncode
        self.log.close()
        assert rc == 0, f"server exited with {rc}:\n{self.output()}"
        os.unlink(self.log_path)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            print(f"--- server output ---\n{self.output()}", flush=True)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            return False
        self.stop()
        return False


def generate_json(model, *args):
    """`servetune generate --json` for the same prompt: the in-process reference."""
    out = subprocess.run([servetune_bin(), "generate", "--model", model, "--json", *args],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def check(cond, message):
    if not cond:
        raise AssertionError(message)
