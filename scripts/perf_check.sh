#!/usr/bin/env bash
# CI performance check: runs configs/ci-perf.yaml on the built-in engine (SmolLM2, CPU) and compares it with the
# committed baseline of this CPU's ISA class in results/ci-perf/baseline-<isa> using the tolerances in the sweep file
# (check.tolerances); exits 1 on a regression. --update-baseline records a new baseline instead (after an intended
# change). The engine's kernels differ by ISA (AVX-512 VNNI against AVX2: 3-5x per token at the same calibrated CPU
# speed), so each class is compared with its own baseline; a class without one is an error, not a pass.
#   scripts/perf_check.sh [--bin PATH] [--update-baseline]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/ci/servetune
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

# The ISA class the engine's CPU kernels ran with, as the engine recorded it (SERVETUNE_CPU_ISA forces one).
record=$(find "$work/run/records" -name '*.json' | sort | head -1)
ISA=$(sed -n 's/.*"engine_cpu_isa": *"\([a-z0-9]*\)".*/\1/p' "${record:-/dev/null}" | head -1)
[ -n "$ISA" ] || { echo "perf_check: the sweep's records do not name the engine's CPU ISA (${record:-no records})" >&2; exit 1; }
BASE=results/ci-perf/baseline-$ISA
echo "perf_check: CPU ISA $ISA, baseline $BASE"

if [ "$UPDATE" = 1 ]; then
  rm -rf "$BASE"
  mkdir -p "$BASE"
  cp -r "$work/run/sweep.json" "$work/run/sweep-file.yaml" "$work/run/records" "$work/run/trials" \
        "$work/run/summary.csv" "$work/run/report.md" "$BASE/"
  echo "perf_check: new baseline in $BASE (commit it)"
  exit 0
fi
if [ ! -f "$BASE/sweep.json" ]; then
  echo "perf_check: no committed baseline for CPU ISA '$ISA' ($BASE); record one on such a machine with" \
    "scripts/perf_check.sh --update-baseline and commit it" >&2
  exit 1
fi
"$BIN" check --baseline "$BASE" --current "$work/run"
