# shellcheck shell=bash
# Sourced by the example tests after `set -u`: a temporary directory $tmp removed at exit, a
# failure counter $fails with fail() to report one, $here (this folder), and synthetic_idx
# (synthetic_idx.sh) to write small MNIST-like data sets.
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
