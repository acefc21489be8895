#!/usr/bin/env bash
# CI performance check: runs configs/ci-perf.yaml on the built-in engine (SmolLM2, CPU) and compares it with the
# committed baseline in results/ci-perf/baseline using the tolerances in the sweep file (check.tolerances);
# exits 1 on a regression. --update-baseline records a new baseline instead (after an intended change).
#   scripts/perf_check.sh [--bin PATH] [--update-baseline]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/ci/tuner/servetune
UPDATE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --update-baseline) UPDATE=1; shift ;;
    *) echo "usage: $0 [--bin PATH] [--update-baseline]" >&2; exit 2 ;;
  esac
done
[ -x "$BIN" ] || { echo "perf_check: $BIN is not built (cmake --preset ci && cmake --build build/ci)" >&2; exit 2; }
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}

work=$(mktemp -d "${TMPDIR:-/tmp}/servetune-perf.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$BIN" sweep configs/ci-perf.yaml --output "$work/run"

BASE=results/ci-perf/baseline
if [ "$UPDATE" = 1 ]; then
  rm -rf "$BASE"
  mkdir -p "$BASE"
  cp -r "$work/run/sweep.json" "$work/run/sweep-file.yaml" "$work/run/records" "$work/run/trials" \
        "$work/run/summary.csv" "$work/run/report.md" "$BASE/"
  echo "perf_check: new baseline in $BASE (commit it)"
  exit 0
fi
"$BIN" check --baseline "$BASE" --current "$work/run"
