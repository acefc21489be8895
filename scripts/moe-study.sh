#!/usr/bin/env bash
# The DeepSeek-R1 study's staged sweep on the built-in engine (configs/deepseek-r1-builtin.yaml, or the Qwen3-MoE
# variant given as the first argument): builds servetune, writes the tiny random-weight model the sweep file names
# (servetune make-model) when it is missing, runs the sweep and prints the report. Minutes on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/deepseek-r1-builtin.yaml}
cmake --preset cpu >/dev/null
cmake --build build/cpu -j "$(nproc)" --target servetune
model=$(sed -n 's/^  model: *//p' "$config" | head -1)
preset=$(basename "$model")
[ -f "$model/config.json" ] || ./build/cpu/servetune make-model --preset "$preset" -o "$model"
name=$(sed -n 's/^name: *//p' "$config" | head -1)
run="results/$name/$(date +%Y%m%d-%H%M%S)"
./build/cpu/servetune sweep "$config" --output "$run"
echo
./build/cpu/servetune report "$run"
echo "Report: $run/report.md and $run/report.html (regenerate: servetune report $run)"
