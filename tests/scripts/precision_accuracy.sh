#!/usr/bin/env bash
# ctest scripts.precision_accuracy: scripts/precision-accuracy runs mnist_mlp in f32 and bf16 on
# two seeds and two layouts (a short training) and writes a table whose accuracies are those
# the example itself reports for the same flags, with the means' and each seed's bf16 - f32; a
# malformed --layouts is refused naming it.
# Exits 77 (ctest: skipped) when this CPU has no bf16 units (--precision bf16 is refused).
# usage: precision_accuracy.sh WORK_DIR BUILD_DIR MNIST_DIR
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 WORK_DIR BUILD_DIR MNIST_DIR" >&2; exit 2; }
work=$1 build=$2 data=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
script=$root/scripts/precision-accuracy
mlp=$build/examples/mnist_mlp
rm -rf "$work"
mkdir -p "$work"
fail() { echo "FAIL: $*" >&2; exit 1; }

short=(--data "$data" --epochs 1 --train-limit 2000 --test-limit 500)
if ! "$mlp" "${short[@]}" --threads 1 --precision bf16 >"$work/probe.log" 2>&1; then
  grep -q "bf16" "$work/probe.log" || fail "the bf16 probe run failed: $(cat "$work/probe.log")"
  echo "skipped: $(grep -m1 bf16 "$work/probe.log")" >&2
  exit 77
fi

MINIDL_BUILD_DIR=$build "$script" --no-build --models mnist_mlp --seeds 1,2 --layouts 1x1,2x1 \
  --out "$work" -- "${short[@]}" >"$work/out.log" 2>&1 || fail "precision-accuracy: $(cat "$work/out.log")"
table=$work/precision-accuracy.md
[ -s "$table" ] || fail "no table written"
rows=$(grep -c '^| mnist_mlp |' "$table")
[ "$rows" -eq 2 ] || fail "expected 2 rows (1x1, 2x1), got $rows: $(cat "$table")"

# The 1x1 row's seed-2 bf16 accuracy is what the example prints for the same flags.
"$mlp" "${short[@]}" --threads 1 --seed 2 --precision bf16 >"$work/direct.log" 2>&1
direct=$(sed -n 's/.*test acc *\([0-9.]*%\).*/\1/p' "$work/direct.log" | tail -1)
row=$(grep '^| mnist_mlp | 1x1 |' "$table")
bf16_cell=$(echo "$row" | awk -F'|' '{print $6}')
echo "$bf16_cell" | grep -q ", $direct" ||
  fail "the table's 1x1 bf16 accuracies ($bf16_cell) lack the direct run's seed-2 $direct"
# bf16 - f32 is the difference of the two means shown.
echo "$row" | awk -F'|' '{f = $5; b = $7; d = $8; gsub(/[ %]/, "", f); gsub(/[ %]/, "", b);
  gsub(/ /, "", d); if (sprintf("%+.2f", b - f) != d) { print "difference " d " is not " b " - " f; exit 1 }}' ||
  fail "wrong difference in: $row"

# Each seed's own bf16 - f32 is its two accuracies' difference, and they average to the means'.
echo "$row" | python3 -c '
import sys
cells = [c.strip() for c in sys.stdin.read().split("|")]
pct = lambda c: [float(v.strip(" %")) for v in c.split(",")]
f32, bf16, diff, per_seed = pct(cells[3]), pct(cells[5]), float(cells[7]), pct(cells[8])
want = [b - f for f, b in zip(f32, bf16)]
assert len(per_seed) == len(want) == 2, per_seed
assert all(abs(p - w) <= 0.011 for p, w in zip(per_seed, want)), (per_seed, want)
assert abs(sum(per_seed) / 2 - diff) <= 0.011, (per_seed, diff)' ||
  fail "wrong per-seed differences in: $row"

if "$script" --no-build --layouts 2y2 >"$work/bad.log" 2>&1; then fail "--layouts 2y2 was accepted"; fi
grep -q -- "--layouts takes a comma-separated list, got '2y2'" "$work/bad.log" ||
  fail "unclear error for --layouts 2y2: $(cat "$work/bad.log")"
echo "ok: $(cat "$table")"
