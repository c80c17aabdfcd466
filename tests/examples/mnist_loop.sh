#!/usr/bin/env bash
# ctest examples.mnist_loop: the hand-written loop of examples/mnist_loop.cpp, two short epochs
# on the first 6400 MNIST training images: the loss it reads from the step falls, the test
# accuracy is far above chance, the saved .safetensors holds the MLP's parameters, and the
# model reloaded from it predicts what the trained model predicted, mostly the true labels.
# Its errors are one line. Exits 77 (ctest: skipped) without the MNIST files ($MINIDL_DATA_DIR).
# Usage: mnist_loop.sh path/to/mnist_loop
set -u
bin=$1
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
data=${MINIDL_DATA_DIR:-}
if [ -z "$data" ] || ! ls "$data"/train-images-idx3-ubyte* >/dev/null 2>&1; then
  echo "skipped: no MNIST files in MINIDL_DATA_DIR='$data' (scripts/fetch-data mnist)"
  exit 77
fi

if ! "$bin" --data "$data" --epochs 2 --train-limit 6400 --save "$tmp/mlp.safetensors" \
  >"$tmp/out" 2>&1; then
  cat "$tmp/out"
  echo "FAIL: the run failed"
  exit 1
fi
cat "$tmp/out"
loss1=$(sed -n 's/^epoch 1  steps 100  train loss \([0-9.]*\)$/\1/p' "$tmp/out")
loss2=$(sed -n 's/^epoch 2  steps 200  train loss \([0-9.]*\)$/\1/p' "$tmp/out")
if [ -z "$loss1" ] || [ -z "$loss2" ]; then
  fail "no 'epoch N  steps S  train loss L' lines for 100 steps per epoch"
elif ! awk -v a="$loss1" -v b="$loss2" 'BEGIN { exit !(b < 0.8 * a && b < 0.6) }'; then
  fail "the training loss went from $loss1 to $loss2"
fi
accuracy=$(sed -n 's/^test accuracy \([0-9.]*\)%$/\1/p' "$tmp/out")
awk -v a="${accuracy:-0}" 'BEGIN { exit !(a > 80) }' ||
  fail "test accuracy '${accuracy}' is not above 80% (chance: 10%)"
trained=$(sed -n 's/^trained model: *//p' "$tmp/out")
reloaded=$(sed -n 's/^reloaded model: *//p' "$tmp/out")
truth=$(sed -n 's/^true labels: *//p' "$tmp/out")
[ "$(wc -w <<<"$trained")" -eq 10 ] || fail "not 10 predictions of the trained model: '$trained'"
[ "$trained" = "$reloaded" ] ||
  fail "the reloaded model predicts '$reloaded', the trained model predicted '$trained'"
[ "$truth" = "7 2 1 0 4 1 4 9 5 9" ] || fail "the first test labels are '$truth'"
agree=0
read -ra p <<<"$reloaded"
read -ra t <<<"$truth"
for i in "${!t[@]}"; do [ "${p[$i]:-}" = "${t[$i]}" ] && agree=$((agree + 1)); done
[ "$agree" -ge 8 ] || fail "only $agree of 10 predictions are the true labels"
! ls "$tmp" | grep -q '\.tmp' || fail "temporary file left behind"
/usr/bin/python3 - "$tmp/mlp.safetensors" <<'PY' || fail "the saved parameters"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    blob = f.read()
n = struct.unpack("<Q", blob[:8])[0]
header = json.loads(blob[8:8 + n])
want = {"fc1.weight": [128, 784], "fc1.bias": [128], "fc2.weight": [10, 128], "fc2.bias": [10]}
got = {k: v["shape"] for k, v in header.items() if k != "__metadata__"}
if got != want:
    sys.exit(f"tensors {got}, expected {want}")
values = sum(s[0] * (s[1] if len(s) > 1 else 1) for s in want.values())
if len(blob) != 8 + n + 4 * values or any(v["dtype"] != "F32" for v in header.values() if "dtype" in v):
    sys.exit(f"{len(blob)} bytes do not hold exactly {values} f32 values after the header")
PY

# Errors: one line naming the problem, exit 1.
"$bin" --data "$data" --train-limit 10 --save "$tmp/x.safetensors" >"$tmp/err" 2>&1
code=$?
{ [ $code -eq 1 ] && grep -q "^mnist_loop: error: the training set has 10 samples, fewer than a batch$" "$tmp/err"; } ||
  fail "a training set smaller than a batch: exit $code, '$(cat "$tmp/err")'"
"$bin" --data "$tmp/nowhere" >"$tmp/err" 2>&1
code=$?
{ [ $code -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "nowhere" "$tmp/err"; } ||
  fail "a missing data directory: exit $code, '$(cat "$tmp/err")'"
[ "$fails" -eq 0 ] && echo "mnist_loop ok"
exit "$fails"
