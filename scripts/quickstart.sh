#!/usr/bin/env bash
# The main job: setup, release build, then run the built-in engine on the real SmolLM2 model.
# (Becomes `servetune sweep configs/quickstart.yaml` once the tuner lands.)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake --preset cpu >/dev/null
cmake --build build/cpu -j "$(nproc)" --target servetune
./build/cpu/tuner/servetune --version
