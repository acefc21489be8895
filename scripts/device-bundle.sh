#!/usr/bin/env bash
# Packs the GPU check's binaries into .device-bundle/bundle.tar.xz (git-ignored; device-check.sh unpacks it: the
# eight binaries each link the whole backend, 116 MB stripped, 30 MB packed) so a bare H200 machine, which has CUDA 13 and
# PyTorch but none of the Debian build dependencies (GTest, CLI11, nlohmann-json, yaml-cpp, libcurl, gloo...), runs
# scripts/device-check.sh without building: the cuda preset's servetune and GPU test binaries (stripped), libcudart,
# and every other shared library they link except glibc's, libstdc++/libgcc (newer there) and the big CUDA
# libraries (cuBLAS, cuBLASLt, NCCL: the machine's CUDA 13 and PyTorch wheels have them; device-check.sh finds them).
# stories260K travels in tests/data; SmolLM2 (98 MB, under models/) does not fit the 64 MiB carry limit, so its
# parity test skips there, saying so.
#
# One-shot device run, from a session that has the machine (about 6 minutes with the bundle, no build there):
#   bash scripts/device-bundle.sh            # here: builds the cuda preset's targets, fills .device-bundle/ (~30 MiB)
#   run(command='bash scripts/device-check.sh /tmp/dc 2>&1 | tee "$OUT/check.txt"; tar czf "$OUT/logs.tgz" -C /tmp dc',
#       carry=[".device-bundle"], timeout_s=560)
# The table comes last in output_tail; the logs its rows name come back in $OUT/logs.tgz (a run returns 8 files at
# most). Without .device-bundle/ the check builds the cuda preset there, which needs those Debian packages: expect it
# to fail there, saying so in the table.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build/cuda}
OUTDIR=.device-bundle
source scripts/gpu_tests.sh
TARGETS=(servetune "${GPU_TEST_TARGETS[@]}")

[ -d "$BUILD" ] || cmake --preset cuda >/dev/null
cmake --build "$BUILD" -j "${JOBS:-$(nproc)}" --target "${TARGETS[@]}"

STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/bin" "$STAGE/lib"
bins=("$BUILD/servetune" "${GPU_TESTS[@]/#/$BUILD/}")
for b in "${bins[@]}"; do
  cp "$b" "$STAGE/bin/"
  strip --strip-unneeded "$STAGE/bin/$(basename "$b")"
done
# Libraries the machine has (glibc's own, libstdc++ / libgcc_s, the driver, cuBLAS, NCCL) stay behind.
system='/(ld-linux[^/]*|lib(c|m|dl|pthread|rt|resolv|util|nsl|anl|gcc_s|stdc\+\+|cuda|cublas|cublasLt|nccl)\.so[^/]*)$'
ldd "${bins[@]}" | awk '/=> \//{print $3}' | sort -u | grep -E -v "$system" | while read -r lib; do
  cp -L "$lib" "$STAGE/lib/"
done
# The test binaries read tests/data through the absolute source path they were built in; the check recreates it.
pwd > "$STAGE/source_dir"
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- engine tests cli tuner report importers loadgen datasets || echo '+changes')" > "$STAGE/commit"
rm -rf "$OUTDIR"
mkdir -p "$OUTDIR"
XZ_OPT=-T0 tar -cJf "$OUTDIR/bundle.tar.xz" -C "$STAGE" .
du -sh "$OUTDIR"
echo "bundle for $(cat "$STAGE/commit") in $OUTDIR/bundle.tar.xz: $(ls "$STAGE/bin" | tr '\n' ' ')+ $(ls "$STAGE/lib" | wc -l) libraries"
