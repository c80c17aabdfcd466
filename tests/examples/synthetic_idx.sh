# shellcheck shell=bash
# Sourced by the example tests: writes a small MNIST-like IDX set of 8x8 images, fixed by a seed,
# so the tests need no downloaded data.
# Usage: synthetic_idx DIR TRAIN_COUNT TEST_COUNT

# idx_bytes N SEED MOD: N pseudo-random bytes (a 32-bit LCG) modulo MOD, as printf escapes.
idx_bytes() {
  local n=$1 x=$2 mod=$3 i b out=""
  for ((i = 0; i < n; i++)); do
    x=$(((x * 1103515245 + 12345) & 0x7fffffff))
    printf -v b '\\x%02x' $((((x >> 16) & 0xff) % mod))
    out+=$b
  done
  printf '%s' "$out"
}

# be32 V: V as 4 big-endian bytes, as printf escapes.
be32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)); }

synthetic_idx() {
  local dir=$1 ntrain=$2 ntest=$3
  mkdir -p "$dir"
  printf '%b' "\\x00\\x00\\x08\\x03$(be32 "$ntrain")$(be32 8)$(be32 8)$(idx_bytes $((ntrain * 64)) 1 256)" \
    >"$dir/train-images-idx3-ubyte"
  printf '%b' "\\x00\\x00\\x08\\x01$(be32 "$ntrain")$(idx_bytes "$ntrain" 2 10)" >"$dir/train-labels-idx1-ubyte"
  printf '%b' "\\x00\\x00\\x08\\x03$(be32 "$ntest")$(be32 8)$(be32 8)$(idx_bytes $((ntest * 64)) 3 256)" \
    >"$dir/t10k-images-idx3-ubyte"
  printf '%b' "\\x00\\x00\\x08\\x01$(be32 "$ntest")$(idx_bytes "$ntest" 4 10)" >"$dir/t10k-labels-idx1-ubyte"
}
