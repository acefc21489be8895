# Shared start of the engine benchmark scripts, sourced first: strict mode and the repository root as the working
# folder; then, after the caller has set NAME and OUT, `bench_start "$@"` sets BUILD (first argument, default
# build/cpu), BIN and MODEL (default SmolLM2 Q4_1), checks they exist, makes OUT, and stops BG_PID (a server or worker
# the caller starts in the background) on exit.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bench_start() {
  BUILD=${1:-build/cpu}
  BIN=$BUILD/servetune
  MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
  [ -x "$BIN" ] || { echo "$NAME: build $BIN first (cmake --build $BUILD --target servetune)" >&2; exit 2; }
  [ -f "$MODEL" ] || { echo "$NAME: $MODEL not found (scripts/setup.sh fetches it)" >&2; exit 2; }
  mkdir -p "$OUT"
  BG_PID=""
  trap 'cleanup_bg' EXIT
}

cleanup_bg() { [ -n "${BG_PID:-}" ] && kill "$BG_PID" 2>/dev/null && wait "$BG_PID" 2>/dev/null; true; }
