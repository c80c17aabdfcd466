# shellcheck shell=bash
# Sourced by the simulated-cluster tests after `set -u`, with their arguments
# (path/to/mnist_mlp SOURCE_DIR SIM_BUILD_DIR [CCACHE]): the example tests' helpers
# (../examples/common.sh: $tmp, fail, synthetic_idx), $mlp, $src, $sim, and, built here first
# (incrementally, in SIM_BUILD_DIR), $simmlp, the MLP built against SimGrid's SMPI, with
# $platform, the 10 GbE star platform file. A failed build ends the test.
mlp=$1 src=$2 sim=$3 launcher=${4:-}
# shellcheck source=../examples/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../examples/common.sh"

if [ ! -f "$sim/CMakeCache.txt" ]; then
  cmake -S "$src" -B "$sim" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMINIDL_SIMGRID=ON \
    ${launcher:+-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher"} >"$tmp/configure.out" 2>&1 ||
    { cat "$tmp/configure.out"; exit 1; }
fi
if ! nice cmake --build "$sim" --target mnist_mlp >"$tmp/build.out" 2>&1; then
  tail -30 "$tmp/build.out"
  echo "FAIL building the simulated MLP in $sim"
  exit 1
fi
simmlp=$sim/examples/mnist_mlp
platform=$src/scripts/platforms/ethernet-10g-star.xml
