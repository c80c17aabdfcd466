#!/usr/bin/env bash
# The package test (ctest package.find_package): installs the build into a fresh prefix under
# WORK_DIR, then configures, builds and runs the consumer project next to this script against
# that prefix alone, as a project outside the tree would.
# usage: run.sh BUILD_DIR WORK_DIR CMAKE GENERATOR CXX_COMPILER BUILD_TYPE
set -euo pipefail
[ $# -eq 6 ] || { echo "usage: $0 BUILD_DIR WORK_DIR CMAKE GENERATOR CXX_COMPILER BUILD_TYPE" >&2; exit 2; }
build=$1 work=$2 cmake=$3 generator=$4 cxx=$5 build_type=$6
here=$(cd "$(dirname "$0")" && pwd)
source_root=$(cd "$here/../.." && pwd)
prefix=$work/prefix

# Prints a step's log and fails when the step fails.
step() {
  local name=$1 log=$work/$1.log
  shift
  echo "package test: $name" >&2
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "package test: $name failed (log: $log)" >&2
    exit 1
  fi
}

rm -rf "$work"
mkdir -p "$work"
step install "$cmake" --install "$build" --prefix "$prefix"

# The installed package must stand alone: nothing in it may point back into the source tree.
if grep -rl --include='*.cmake' "$source_root" "$prefix" >&2; then
  echo "package test: the installed CMake files above refer to the source tree $source_root" >&2
  exit 1
fi
for h in core/tensor.hpp ir/graph.hpp ops/registry.hpp ops/op_table.hpp parallel/op_table.hpp \
    frontend/trainer.hpp; do
  [ -f "$prefix/include/minidl/$h" ] || { echo "package test: header minidl/$h not installed" >&2; exit 1; }
done

# No package registry: only the fresh prefix may provide minidl.
step configure "$cmake" -S "$here" -B "$work/build" -G "$generator" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE="$build_type" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
found=$(sed -n 's/^minidl_DIR:PATH=//p' "$work/build/CMakeCache.txt")
case "$found" in
  "$prefix"/*) ;;
  *) echo "package test: find_package(minidl) found '$found', not the package in $prefix" >&2; exit 1 ;;
esac
step build "$cmake" --build "$work/build" --parallel 2
echo "package test: run" >&2
"$work/build/consumer"
