#!/usr/bin/env bash
# ctest scripts.plot_metrics: scripts/plot-metrics draws two runs into a valid PNG, and refuses a
# malformed metrics file naming the file and line. One run's metrics are written here (with a
# configuration record); the other comes from a short mnist_mlp run when the binary and the MNIST
# files ($MINIDL_DATA_DIR) are there, else it is written here too (without one).
# Exits 77 (ctest: skipped) when the interpreter of scripts/plot-metrics has no matplotlib.
# usage: plot_metrics.sh WORK_DIR [MNIST_MLP]
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 WORK_DIR [MNIST_MLP]" >&2; exit 2; }
work=$1 mlp=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
plot=$root/scripts/plot-metrics
python=$(sed -n '1s/^#!//p' "$plot")
if ! $python -c 'import matplotlib' 2>/dev/null; then
  echo "skipped: $python has no matplotlib (Debian package python3-matplotlib)" >&2
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"

a=$work/run-a.jsonl b=$work/run-b.jsonl png=$work/curves.png
{
  echo '{"config": {"example": "mnist_mlp", "ranks": 2, "threads": 1, "lr": 0.01}}'
  for e in 1 2 3 4; do
    awk -v e="$e" 'BEGIN {
      printf "{\"epoch\": %d, \"train_loss\": %.4f, \"train_accuracy\": %.4f, ", e, 1.5 / e, 0.95 - 0.3 / e
      printf "\"test_loss\": %.4f, \"test_accuracy\": %.4f, \"epoch_seconds\": 0.8}\n", 1.6 / e, 0.93 - 0.3 / e
    }'
  done
} >"$a"
data=${MINIDL_DATA_DIR:-}
if [ -n "$mlp" ] && [ -n "$data" ] && ls "$data"/train-images-idx3-ubyte* >/dev/null 2>&1; then
  echo "run b: $mlp on the first 2000 MNIST training samples, 2 epochs" >&2
  "$mlp" --data "$data" --epochs 2 --train-limit 2000 --test-limit 500 --hidden 32 --threads 1 \
    --metrics "$b" >"$work/mnist_mlp.log"
else
  echo "run b: written by the test (no mnist_mlp or no MNIST files in '$data')" >&2
  for e in 1 2 3; do
    awk -v e="$e" 'BEGIN {
      printf "{\"epoch\": %d, \"train_loss\": %.4f, \"train_accuracy\": %.4f, ", e, 0.9 / e, 0.97 - 0.1 / e
      printf "\"test_loss\": %.4f, \"test_accuracy\": %.4f}\n", 0.95 / e, 0.96 - 0.1 / e
    }'
  done >"$b"
fi

"$plot" "$a" "$b" -o "$png" --title "plot-metrics test"
[ -f "$png" ] || { echo "FAIL: $png was not written" >&2; exit 1; }
signature=$(head -c 8 "$png" | od -An -tx1 | tr -d ' \n')
[ "$signature" = 89504e470d0a1a0a ] || { echo "FAIL: $png has no PNG signature (starts $signature)" >&2; exit 1; }
# The IHDR chunk follows: width and height as 4-byte big-endian integers at offsets 16 and 20.
width=$((16#$(od -An -tx1 -j16 -N4 "$png" | tr -d ' \n')))
height=$((16#$(od -An -tx1 -j20 -N4 "$png" | tr -d ' \n')))
size=$(stat -c %s "$png")
echo "curves.png: ${width}x${height}, $size bytes" >&2
[ "$width" -ge 400 ] && [ "$height" -ge 200 ] || { echo "FAIL: image is only ${width}x${height}" >&2; exit 1; }
[ "$size" -ge 10000 ] || { echo "FAIL: $png is only $size bytes" >&2; exit 1; }
if ls "$work"/.plot-* >/dev/null 2>&1; then echo "FAIL: temporary files left in $work" >&2; exit 1; fi

# A malformed line: a non-zero exit, a message naming file and line, and no PNG.
bad=$work/bad.jsonl
printf '{"epoch": 1, "train_loss": 1.0}\n{"epoch": 2, "train_loss": \n' >"$bad"
if "$plot" "$bad" -o "$work/bad.png" 2>"$work/bad.err"; then
  echo "FAIL: plot-metrics accepted a malformed file" >&2
  exit 1
fi
grep -q "$bad:2: not a JSON object" "$work/bad.err" || {
  echo "FAIL: the error does not name $bad:2:" >&2
  cat "$work/bad.err" >&2
  exit 1
}
[ ! -e "$work/bad.png" ] || { echo "FAIL: a PNG was written for a malformed file" >&2; exit 1; }
echo "ok" >&2
