#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each for N seconds (default 60) from its committed
# seed corpus in tests/fuzz/corpus/<name>/; a crash, leak or timeout fails the script and keeps the reproducer.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
cmake --preset fuzz >/dev/null
cmake --build build/fuzz -j "${JOBS:-$(nproc)}" --target fuzzers
status=0
for bin in build/fuzz/tests/fuzz/fuzz_*; do
  name=$(basename "$bin"); name=${name#fuzz_}
  work=build/fuzz/corpus-$name
  mkdir -p "$work" build/fuzz/artifacts
  echo "fuzz: $name for ${SECONDS_EACH}s"
  if ! "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
      -artifact_prefix=build/fuzz/artifacts/"$name"- "$work" "tests/fuzz/corpus/$name" 2>build/fuzz/"$name".log; then
    tail -40 build/fuzz/"$name".log
    echo "fuzz: $name FAILED (reproducer in build/fuzz/artifacts/)" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|Done" build/fuzz/"$name".log | tail -2 || true
  fi
done
exit $status
