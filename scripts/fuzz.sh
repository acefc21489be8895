#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs them all at once for N seconds (default 60) from their
# committed seed corpora in tests/fuzz/corpus/<name>/; a crash, leak or timeout fails the script and keeps the
# reproducer. CONFIGURE (optional) holds extra cmake configure arguments (scripts/test.sh passes its ccache launcher).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-60}
# shellcheck disable=SC2086  # CONFIGURE is a list of words
cmake --preset fuzz ${CONFIGURE:-} >/dev/null
cmake --build build/fuzz -j "${JOBS:-$(nproc)}" --target fuzzers
mkdir -p build/fuzz/artifacts
names=()
pids=()
for bin in build/fuzz/tests/fuzz/fuzz_*; do
  name=$(basename "$bin"); name=${name#fuzz_}
  work=build/fuzz/corpus-$name
  mkdir -p "$work"
  echo "fuzz: $name for ${SECONDS_EACH}s"
  "$bin" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
    -artifact_prefix=build/fuzz/artifacts/"$name"- "$work" "tests/fuzz/corpus/$name" 2>build/fuzz/"$name".log &
  names+=("$name")
  pids+=($!)
done
status=0
for i in "${!pids[@]}"; do
  name=${names[$i]}
  if ! wait "${pids[$i]}"; then
    tail -40 build/fuzz/"$name".log
    echo "fuzz: $name FAILED (reproducer in build/fuzz/artifacts/)" >&2
    status=1
  else
    echo "fuzz: $name: $(grep -E "stat::number_of_executed_units" build/fuzz/"$name".log | tail -1)"
  fi
done
exit $status
