#!/usr/bin/env bash
# Manual check that a peer load generator runs against `servetune serve` without errors: guidellm (PyPI), installed
# into a throw-away venv on first use, drives /v1/completions (and /v1/chat/completions when the model has a chat
# template) with synthetic prompts at a fixed concurrency; the check fails if guidellm reports any errored request.
# Usage: scripts/check_serve_peer.sh [BUILD_DIR]   env: MODEL PEER_VENV REQUESTS STREAMS OUT
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/ci}
BIN=$BUILD/servetune
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$MODEL" ] || MODEL=tests/data/stories260K.gguf
PEER_VENV=${PEER_VENV:-${TMPDIR:-/tmp}/servetune-peer-venv}
REQUESTS=${REQUESTS:-64}
STREAMS=${STREAMS:-8}
OUT=${OUT:-results/check_serve_peer/raw}
mkdir -p "$OUT"
[ -x "$BIN" ] || { echo "check_serve_peer: build $BIN first" >&2; exit 2; }

if [ ! -x "$PEER_VENV/bin/guidellm" ]; then
  python3 -m venv "$PEER_VENV"
  "$PEER_VENV/bin/pip" install -q guidellm
fi
echo "peer: $("$PEER_VENV/bin/guidellm" --version)"

# guidellm sizes synthetic prompts with a Hugging Face tokenizer; use a committed tokenizer.json (offline).
TOK=$(mktemp -d)
SERVER_PID=""
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$TOK"
}
trap cleanup EXIT
cp tests/data/hf_models/llama_tiny/tokenizer.json "$TOK/"
echo '{"tokenizer_class": "PreTrainedTokenizerFast"}' >"$TOK/tokenizer_config.json"

"$BIN" serve --model "$MODEL" --port 0 --served-model-name peer >"$OUT/serve.log" 2>&1 &
SERVER_PID=$!
PORT=""
for _ in $(seq 600); do
  PORT=$(grep -o 'listening on http://[^ ]*' "$OUT/serve.log" | sed 's/.*://' || true)
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "$PORT" ] || { cat "$OUT/serve.log" >&2; exit 1; }

routes=(/v1/completions)
if curl -sf "http://127.0.0.1:$PORT/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model":"peer","messages":[{"role":"user","content":"hi"}],"max_tokens":1}' >/dev/null; then
  routes+=(/v1/chat/completions)
fi

status=0
for route in "${routes[@]}"; do
  name=$(echo "${route#/}" | tr / _)
  echo "=== guidellm -> $route ($REQUESTS requests, $STREAMS streams)"
  if ! "$PEER_VENV/bin/guidellm" run \
    --backend "kind=openai_http,target=http://127.0.0.1:$PORT,model=peer,request_format=$route" \
    --profile "kind=concurrent,streams=$STREAMS" \
    --constraint "kind=max_requests,count=$REQUESTS" \
    --data "kind=synthetic_text,prompt_tokens=64,output_tokens=32" \
    --tokenizer "kind=huggingface_auto,model=$TOK" \
    --output "kind=json,path=$OUT/guidellm_$name.json" \
    --disable-progress 2>&1 | tee "$OUT/guidellm_$name.txt" | tail -40; then
    echo "guidellm failed on $route" >&2
    status=1
    continue
  fi
  python3 - "$OUT/guidellm_$name.json" <<'PY' || status=1
import json, sys
report = json.load(open(sys.argv[1]))
def find(obj, key):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                yield v
            yield from find(v, key)
    elif isinstance(obj, list):
        for v in obj:
            yield from find(v, key)
totals = next(find(report, "request_totals"), None)
print("request totals:", totals)
for errored in find(report, "errored"):
    if isinstance(errored, list):
        for r in errored[:5]:
            print("errored request:", next(find(r, "error"), r))
if not totals or totals.get("errored", 1) != 0 or totals.get("successful", 0) == 0:
    sys.exit("guidellm reported errored requests (or none successful)")
PY
done
kill -TERM "$SERVER_PID"
wait "$SERVER_PID"
SERVER_PID=""
[ "$status" -eq 0 ] && echo "check_serve_peer: ok" || echo "check_serve_peer: FAILED"
exit "$status"
