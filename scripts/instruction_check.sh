#!/usr/bin/env bash
# CI's deterministic performance gate: the CPU instructions the built-in engine executes, counted by valgrind's
# cachegrind, for SmolLM2 Q4_1 generating from a fixed prompt on one thread (AVX2 kernels: valgrind cannot run
# AVX-512). Two runs (N1 and N2 generated tokens) give the decode cost per token, (I(N2) - I(N1)) / (N2 - N1), and
# the fixed cost (load + prefill). Unlike wall-clock or CPU time these counts repeat to within a few hundred
# instructions in 1.5e9 run to run, whatever else the machine is doing, so a tight tolerance catches a small
# regression. Settings that could follow the host (threads, KV capacity) are fixed. Compares with
# results/ci-perf/instructions.json; exits 1 when either cost grew beyond the tolerance.
#   scripts/instruction_check.sh [--bin PATH] [--tolerance PERCENT] [--update-baseline]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=build/ci/servetune
TOLERANCE=1
UPDATE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --tolerance) TOLERANCE=$2; shift 2 ;;
    --update-baseline) UPDATE=1; shift ;;
    *) echo "usage: $0 [--bin PATH] [--tolerance PERCENT] [--update-baseline]" >&2; exit 2 ;;
  esac
done
MODEL=models/SmolLM2-135M-Instruct.Q4_1.gguf
BASE=results/ci-perf/instructions.json
PROMPT="The quick brown fox jumps over the lazy dog. Once upon a time, in a land far away, there lived"
N1=4
N2=20
[ -x "$BIN" ] || { echo "instruction_check: $BIN is not built" >&2; exit 2; }
[ -f "$MODEL" ] || { echo "instruction_check: $MODEL is missing (scripts/setup.sh fetches it)" >&2; exit 2; }
command -v valgrind >/dev/null || { echo "instruction_check: valgrind is not installed (scripts/setup.sh installs it)" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/servetune-instr.XXXXXX")
trap 'rm -rf "$work"' EXIT
count() {  # instructions of one generate run of $1 tokens
  SERVETUNE_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1 \
    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null --log-file="$work/vg.$1" \
    "$BIN" generate -m "$MODEL" -p "$PROMPT" -n "$1" --threads 1 --max-total-tokens 1024 --ignore-eos --json > "$work/out.$1"
  python3 - "$work/out.$1" "$1" <<'PY'
import json, sys
out = json.load(open(sys.argv[1]))
if len(out["output_ids"]) != int(sys.argv[2]):
    sys.exit(f"instruction_check: generated {len(out['output_ids'])} tokens, expected {sys.argv[2]}")
PY
  sed -n 's/.*I *refs: *\([0-9,]*\).*/\1/p' "$work/vg.$1" | tr -d ,
}
I1=$(count $N1)
I2=$(count $N2)
[ -n "$I1" ] && [ -n "$I2" ] || { echo "instruction_check: valgrind reported no instruction count ($work)" >&2; exit 1; }

python3 - "$I1" "$I2" "$N1" "$N2" "$BASE" "$UPDATE" "$TOLERANCE" "$(valgrind --version)" "$(${CXX:-c++} --version | head -1)" <<'PY'
import json, os, sys
i1, i2, n1, n2 = (int(v) for v in sys.argv[1:5])
base_path, update, tolerance, valgrind, compiler = sys.argv[5], sys.argv[6] == "1", float(sys.argv[7]), sys.argv[8], sys.argv[9]
current = {"decode_instructions_per_token": (i2 - i1) / (n2 - n1), "fixed_instructions": i1 - n1 * (i2 - i1) / (n2 - n1)}
if update:
    json.dump({"valgrind": valgrind, "compiler": compiler, "tokens": [n1, n2], "instructions": [i1, i2], **current},
              open(base_path, "w"), indent=2)
    print(f"instruction_check: new baseline in {base_path} (commit it)")
    sys.exit(0)
if not os.path.exists(base_path):
    sys.exit(f"instruction_check: no baseline {base_path}; record one with --update-baseline and commit it")
base = json.load(open(base_path))
if base.get("compiler") != compiler or base.get("valgrind") != valgrind:
    print(f"instruction_check: warning: the baseline was counted with {base.get('compiler')} / {base.get('valgrind')},"
          f" this run with {compiler} / {valgrind}: counts differ by design across compilers")
failed = False
for key in ("decode_instructions_per_token", "fixed_instructions"):
    change = (current[key] - base[key]) / base[key] * 100
    verdict = "REGRESSION" if change > tolerance else ("improved (update the baseline)" if change < -tolerance else "ok")
    failed |= verdict == "REGRESSION"
    print(f"instruction_check: {key}: {current[key] / 1e6:.3f} M (baseline {base[key] / 1e6:.3f} M, "
          f"{change:+.2f}%, tolerance +{tolerance}%): {verdict}")
sys.exit(1 if failed else 0)
PY
