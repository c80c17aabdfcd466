#!/usr/bin/env bash
# ctest scripts.epoch_rates: bench/epoch-rates on short mnist_mlp epochs reports the example's
# own FLOP count (784 -> 256 -> 128 -> 10: 1 007 104 FLOPs per sample, the first layer without
# a data gradient), one line per length and precision with the SGEMM measured beside them, and
# the per-sample change between the lengths; bad flags are refused naming them.
# usage: epoch_rates.sh WORK_DIR BUILD_DIR MNIST_DIR
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 WORK_DIR BUILD_DIR MNIST_DIR" >&2; exit 2; }
work=$1 build=$2 data=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
script=$root/bench/epoch-rates
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

MINIDL_BUILD_DIR=$build "$script" --no-build --example mnist_mlp --rounds 1 --lengths 1000,2000 \
  --precisions f32 --threads 1 --test-limit 100 --data "$data" --out "$work/report.txt" \
  >"$work/out.log" 2>&1 || fail "epoch-rates: $(cat "$work/out.log")"
report=$work/report.txt
grep -q '^mnist_mlp, 1 thread(s), 1 round(s); SGEMM (oneDNN 1024^3) [0-9.]* GFLOP/s before, [0-9.]* after$' \
  "$report" || fail "no SGEMM line: $(cat "$report")"
for n in 1000 2000; do
  grep -q "^$n samples (1.01 MFLOP per sample):$" "$report" ||
    fail "no $n-sample block with 1.01 MFLOP per sample: $(cat "$report")"
done
[ "$(grep -c '^  f32  .* s  [0-9.]* GFLOP/s = [0-9.]*% / [0-9.]*% of the SGEMM  [0-9.]* us per sample$' "$report")" -eq 2 ] ||
  fail "expected two f32 rows: $(cat "$report")"
grep -q '^f32: 2000 samples cost [-+][0-9.]*% per sample against 1000$' "$report" ||
  fail "no per-sample comparison: $(cat "$report")"

bad() {  # bad EXPECTED-MESSAGE FLAGS...
  local want=$1
  shift
  if MINIDL_BUILD_DIR=$build "$script" --no-build --data "$data" "$@" >"$work/bad.log" 2>&1; then
    fail "accepted: $*"
  fi
  grep -qF -- "$want" "$work/bad.log" || fail "unclear error for $*: $(cat "$work/bad.log")"
}
bad "--lengths takes sample counts above 0 and \`full\`, not '0'" --lengths 0
bad "--precisions takes f32 and bf16, each at most once, not 'f16'" --precisions f16
bad "--rounds must be at least 1, not 0" --rounds 0
bad "no data directory '$work/none'" --data "$work/none"
echo "ok: $(cat "$report")"
