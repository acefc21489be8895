#!/usr/bin/env bash
# The test command: setup, warnings-as-errors release build, all ctest suites, a compile+link of the cuda preset
# (CUDA backend + nccl communicator) and of the hip preset, an ASan+UBSan build of the unit tests, and 60 s of libFuzzer on each parser (file formats, HTTP and OpenAI requests, SSE streams). What CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
source scripts/gpu_tests.sh

bash scripts/setup.sh
export SERVETUNE_REQUIRE_MODELS=1
export SERVETUNE_REQUIRE_SLURM=1  # the slurm executor's test runs on a one-node cluster it starts (setup installs slurm-wlm)
export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}

step() { echo; echo "=== $* ($(date +%T), $((SECONDS / 60)) min in)"; }

# ccache (Debian's; its cache lives outside the checkout, in ~/.ccache): the cuda and hip presets compile every CPU
# object exactly as the ci preset does (the GPU defines and CUDA headers stay private to the files that need them), so
# they compile only their GPU objects, and a later run on the same machine recompiles only what changed.
CONFIGURE=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR="$PWD"  # paths inside the checkout hash relative to the build folder: any clone hits
  CONFIGURE=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
  ccache --zero-stats >/dev/null
fi

step "release build (warnings are errors)"
cmake --preset ci "${CONFIGURE[@]}" >/dev/null
cmake --build build/ci -j "$JOBS"
step "tests"
ctest --test-dir build/ci --output-on-failure -j "$JOBS" --timeout 900

step "cuda backend and nccl communicator compile and link (preset cuda: sm_90a + sm_80; nothing runs without a GPU)"
if [ -x /usr/local/cuda/bin/nvcc ] && [ -f /usr/local/cuda/include/nccl.h ]; then
  cmake --preset cuda "${CONFIGURE[@]}" >/dev/null
  cmake --build build/cuda -j "$JOBS" --target servetune "${GPU_TEST_TARGETS[@]}" test_comm
elif [ -f /usr/local/cuda/include/nccl.h ]; then
  echo "no nvcc: only the nccl communicator (preset nccl)"
  cmake --preset nccl "${CONFIGURE[@]}" >/dev/null
  cmake --build build/nccl -j "$JOBS" --target test_comm
else
  echo "skipped: no CUDA/NCCL at /usr/local/cuda"
fi

step "hip backend compiles and links (preset hip: the same .cu sources through hipcc, gfx90a)"
if command -v hipcc >/dev/null; then
  cmake --preset hip "${CONFIGURE[@]}" >/dev/null
  # The GPU kernel tests link the whole backend (core + cpu + hip objects) without rebuilding the rest of the engine.
  cmake --build build/hip -j "$JOBS" --target "${GPU_TESTS_HIP[@]}"
else
  echo "skipped: no hipcc (scripts/setup.sh installs Debian's)"
fi

step "device check, dry run on the CPU (the GPU script's steps before any GPU time is spent)"
bash scripts/device-check.sh --dry-run --bin build/ci/servetune "$(mktemp -d)"

step "performance check against the committed baseline (configs/ci-perf.yaml)"
bash scripts/perf_check.sh --bin build/ci/servetune

step "instruction-count check against the committed baseline (valgrind, deterministic)"
bash scripts/instruction_check.sh --bin build/ci/servetune

step "ASan + UBSan build of the unit tests"
cmake --preset asan "${CONFIGURE[@]}" >/dev/null
cmake --build build/asan -j "$JOBS" --target unit_tests
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j "$JOBS" -L unit --timeout 900

step "fuzzing the parsers (${FUZZ_SECONDS}s each, all at once)"
CONFIGURE="${CONFIGURE[*]}" bash scripts/fuzz.sh "$FUZZ_SECONDS"

if command -v ccache >/dev/null; then ccache --show-stats | grep -E "Hits|Misses" || true; fi
step "all tests passed"
