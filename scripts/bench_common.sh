# Shared start of the engine benchmark scripts (sourced, with the caller's arguments): BUILD (first argument,
# default build/cpu), BIN, MODEL (default SmolLM2 Q4_1) checked to exist, the output folder OUT made, and BG_PID (a
# server or worker the caller starts in the background) stopped on exit. The caller sets NAME and OUT first.
BUILD=${1:-build/cpu}
BIN=$BUILD/tuner/servetune
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -x "$BIN" ] || { echo "$NAME: build $BIN first (cmake --build $BUILD --target servetune)" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "$NAME: $MODEL not found (scripts/setup.sh fetches it)" >&2; exit 2; }
mkdir -p "$OUT"
BG_PID=""
cleanup() { [ -n "$BG_PID" ] && kill "$BG_PID" 2>/dev/null && wait "$BG_PID" 2>/dev/null; true; }
trap cleanup EXIT
