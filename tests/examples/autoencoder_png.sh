#!/usr/bin/env bash
# ctest examples.autoencoder_png: mnist_autoencoder --png writes, after a few training steps on a
# synthetic set of 8x8 images, a valid grayscale PNG (signature, IHDR, every CRC, the inflated
# rows) as wide as the test images in a row and two images high, framed and separated by 2-pixel
# gaps, whose top row holds the test images' own bytes; a missing directory is a bad flag,
# refused before training.
# Usage: autoencoder_png.sh path/to/mnist_autoencoder
set -u
bin=$(realpath "$1")
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 200 40

# check_png FILE IMAGES TEST_IMAGES: FILE holds IMAGES 8x8 test images above as many others.
check_png() {
  /usr/bin/python3 - "$@" <<'PY'
import struct, sys, zlib
path, n, images = sys.argv[1], int(sys.argv[2]), sys.argv[3]
blob = open(path, "rb").read()
if blob[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit(f"{path}: no PNG signature")
at, chunks, idat = 8, [], b""
while at < len(blob):
    length, kind = struct.unpack(">I4s", blob[at:at + 8])
    data = blob[at + 8:at + 8 + length]
    (crc,) = struct.unpack(">I", blob[at + 8 + length:at + 12 + length])
    if crc != zlib.crc32(kind + data):
        sys.exit(f"{path}: bad CRC in {kind}")
    chunks.append(kind)
    if kind == b"IHDR":
        width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", data)
    if kind == b"IDAT":
        idat += data
    at += 12 + length
if chunks[0] != b"IHDR" or chunks[-1] != b"IEND" or b"IDAT" not in chunks:
    sys.exit(f"{path}: chunks {chunks}")
want = (n * 8 + (n + 1) * 2, 2 * 8 + 3 * 2)
if (width, height) != want or (depth, colour, interlace) != (8, 0, 0):
    sys.exit(f"{path}: {width}x{height}, depth {depth}, colour {colour}; expected {want[0]}x{want[1]} 8-bit gray")
raw = zlib.decompress(idat)
if len(raw) != (width + 1) * height or any(raw[y * (width + 1)] != 0 for y in range(height)):
    sys.exit(f"{path}: {len(raw)} bytes of rows, expected {(width + 1) * height} with filter 0")
rows = [raw[y * (width + 1) + 1:(y + 1) * (width + 1)] for y in range(height)]
pixels = open(images, "rb").read()[16:]
for i in range(n):
    for y in range(8):
        got = rows[2 + y][2 + i * 10:2 + i * 10 + 8]
        if got != pixels[i * 64 + y * 8:i * 64 + y * 8 + 8]:
            sys.exit(f"{path}: row {y} of image {i} is {list(got)}, the test image's {list(pixels[i * 64 + y * 8:][:8])}")
if any(rows[y] != bytes([128]) * width for y in (0, 1, 10, 11, 20, 21)):
    sys.exit(f"{path}: the frame or the gap between the rows is not gray 128")
print(f"{path}: {width}x{height}, {len(chunks)} chunks, inputs in the top row")
PY
}

run() {
  "$bin" --data "$tmp/data" --epochs 1 --max-steps 3 --batch-size 16 --threads 1 "$@"
}
run --png "$tmp/ae.png" >"$tmp/out" 2>&1 || fail "the run with --png: $(cat "$tmp/out")"
grep -q "^mnist_autoencoder: wrote $tmp/ae.png: 10 test images above their reconstructions$" \
  "$tmp/out" || fail "no line saying the PNG was written: $(cat "$tmp/out")"
check_png "$tmp/ae.png" 10 "$tmp/data/t10k-images-idx3-ubyte" || fail "the PNG of 10 images"
! ls "$tmp" | grep -q '\.tmp' || fail "temporary file left behind"

# Fewer test images than 10: the grid is as wide as they are; --quiet prints only its line.
run --test-limit 4 --png "$tmp/four.png" --quiet >"$tmp/out" 2>&1 || fail "--test-limit 4"
[ "$(wc -l <"$tmp/out")" -eq 1 ] || fail "--quiet printed more than one line: $(cat "$tmp/out")"
check_png "$tmp/four.png" 4 "$tmp/data/t10k-images-idx3-ubyte" || fail "the PNG of 4 images"

# A missing directory: a bad flag (exit 2), before any training.
run --png "$tmp/nowhere/ae.png" >"$tmp/out" 2>&1
code=$?
{ [ $code -eq 2 ] && grep -q "^mnist_autoencoder: error: --png: cannot write '$tmp/nowhere/ae.png': the directory '$tmp/nowhere' does not exist$" "$tmp/out" &&
  ! grep -q "^epoch" "$tmp/out"; } || fail "--png in a missing directory: exit $code, $(cat "$tmp/out")"
# Without --png, no PNG anywhere.
(cd "$tmp" && run >/dev/null 2>&1) || fail "the run without --png"
[ -z "$(find "$tmp" -maxdepth 1 -name '*.png' ! -name ae.png ! -name four.png)" ] ||
  fail "a PNG written without --png"
[ "$fails" -eq 0 ] && echo "autoencoder_png ok"
exit "$fails"
