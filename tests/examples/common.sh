# shellcheck shell=bash
# Sourced by the example tests after `set -u`: a temporary directory $tmp removed at exit, a
# failure counter $fails with fail() to report one, $here (this folder), and synthetic_idx
# (synthetic_idx.sh) to write small MNIST-like data sets, and on_layout to run a command on a
# ranks x threads layout.
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
