#!/usr/bin/env bash
# The main job: setup, release build, then tune the built-in engine on SmolLM2 (configs/quickstart.yaml, a couple
# of minutes on two cores) and print the report. The run folder (records, report.md, report.html) is kept under
# results/quickstart/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset cpu >/dev/null
cmake --build build/cpu -j "$(nproc)" --target servetune
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
run="results/quickstart/$(date +%Y%m%d-%H%M%S)"
./build/cpu/servetune sweep configs/quickstart.yaml --output "$run"
echo
./build/cpu/servetune report "$run"
echo "Report: $run/report.md and $run/report.html (regenerate: servetune report $run)"
