# shellcheck shell=bash
# Sourced by the example tests after `set -u`: a temporary directory $tmp removed at exit, a
# failure counter $fails with fail() to report one, $here (this folder), and synthetic_idx
# (synthetic_idx.sh) to write small MNIST-like data sets, on_layout to run a command on a
# ranks x threads layout, and cifar_one_epoch to train a CIFAR-10 example briefly.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() {
  echo "FAIL $*"
  fails=$((fails + 1))
}
# shellcheck source=synthetic_idx.sh
source "$here/synthetic_idx.sh"

# on_layout RANKS THREADS CMD...: CMD with OMP_NUM_THREADS=THREADS, as one plain process for one
# rank, else under "$mpirun" (set by the caller) with RANKS ranks; idle OpenMP threads sleep,
# since the layouts may oversubscribe the cores.
on_layout() {
  local ranks=$1 threads=$2
  shift 2
  if [ "$ranks" -eq 1 ]; then
    OMP_NUM_THREADS=$threads "$@"
  else
    "$mpirun" -np "$ranks" --oversubscribe --bind-to none -x OMP_WAIT_POLICY=passive \
      -x OMP_NUM_THREADS="$threads" "$@"
  fi
}

# cifar_one_epoch BIN: BIN (a CIFAR-10 example) trains one epoch on the first 320 training images
# in $MINIDL_DATA_DIR with its own defaults on one thread, writing $tmp/metrics.jsonl and
# $tmp/model.safetensors, and shows its output. Without the CIFAR-10 files the test exits 77
# (ctest: skipped); when the run fails, 1.
cifar_one_epoch() {
  local bin=$1 data=${MINIDL_DATA_DIR:-}
  if [ -z "$data" ] || ! ls "$data"/data_batch_1.bin* >/dev/null 2>&1; then
    echo "skipped: no CIFAR-10 files in MINIDL_DATA_DIR='$data' (scripts/fetch-data cifar10)"
    exit 77
  fi
  if ! "$bin" --data "$data" --epochs 1 --train-limit 320 --test-limit 200 --threads 1 \
    --metrics "$tmp/metrics.jsonl" --save "$tmp/model.safetensors" >"$tmp/out" 2>&1; then
    cat "$tmp/out"
    echo "FAIL: the run failed"
    exit 1
  fi
  cat "$tmp/out"
}
