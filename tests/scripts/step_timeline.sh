#!/usr/bin/env bash
# ctest scripts.step_timeline: scripts/step-timeline splits each step's period by which threads
# run kernels. First on a trace written here with known answers (steps of 100 us: thread 0 busy
# 0-30 us, thread 1 busy 20-50 us, so no kernel 50, thread 0 only 20, others only 20, overlap 10),
# then on a real two-replica mnist_cnn trace when the binary and the MNIST files
# ($MINIDL_DATA_DIR) are there (the four parts' means add up to the period's), then a file that
# is not a trace (one-line error, exit 1).
# usage: step_timeline.sh WORK_DIR [MNIST_CNN]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 WORK_DIR [MNIST_CNN]" >&2; exit 2; }
work=$1 cnn=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
tool=$root/scripts/step-timeline
rm -rf "$work"
mkdir -p "$work"

python3 - "$work/known.json" <<'PY'
import json, sys
ev = []
for s in range(20):
    t = 100.0 * s
    ev.append({"ph": "X", "pid": 0, "tid": 0, "name": "first", "ts": t, "dur": 10.0})
    ev.append({"ph": "X", "pid": 0, "tid": 0, "name": "second", "ts": t + 10, "dur": 20.0})
    ev.append({"ph": "X", "pid": 0, "tid": 1, "name": "other", "ts": t + 20, "dur": 30.0})
json.dump({"traceEvents": ev}, open(sys.argv[1], "w"))
PY
"$tool" "$work/known.json" --skip 2 >"$work/known.txt"
cat "$work/known.txt"
expect() {  # row median mean
  grep -qE "^$1 +$2 +$3\$" "$work/known.txt" || { echo "FAIL: expected '$1 $2 $3'" >&2; exit 1; }
}
grep -q "17 steps (after 2 warm-up), each from 'first'" "$work/known.txt"
expect period 100.0 100.0
expect "no kernel" 50.0 50.0
expect "thread 0 only" 20.0 20.0
expect "others only" 20.0 20.0
expect overlap 10.0 10.0
expect "kernels, thread 0" 30.0 30.0
expect "kernels, thread 1" 30.0 30.0

data=${MINIDL_DATA_DIR:-}
if [ -n "$cnn" ] && [ -n "$data" ] && ls "$data"/train-images-idx3-ubyte* >/dev/null 2>&1; then
  "$cnn" --data "$data" --threads 2 --epochs 1 --train-limit 960 --test-limit 100 --quiet \
    --trace "$work/cnn.json" >"$work/cnn.log"
  "$tool" "$work/cnn.json" --skip 5 >"$work/cnn.txt"
  cat "$work/cnn.txt"
  grep -q "24 steps (after 5 warm-up)" "$work/cnn.txt"
  awk '$1 == "period" { p = $NF } $1 == "no" || $2 == "0" || $1 == "others" || $1 == "overlap" { s += $NF }
       END { d = p - s; if (d < 0) d = -d; if (d > 0.5) { print "FAIL: parts " s " vs period " p; exit 1 } }' \
    "$work/cnn.txt"
else
  echo "no mnist_cnn run (no binary or no MNIST files in '$data')" >&2
fi

echo '{"not": "a trace"}' >"$work/bad.json"
if "$tool" "$work/bad.json" 2>"$work/bad.err"; then
  echo "FAIL: a file without traceEvents was accepted" >&2
  exit 1
fi
grep -q "is not a Chrome trace" "$work/bad.err"
[ "$(wc -l <"$work/bad.err")" -eq 1 ]
echo "step-timeline: ok"
