#!/usr/bin/env bash
# A table of corrupt inputs, generated here, each given to an example: every one must end with
# exit code 1, exactly one line on stderr naming the file and the problem, and no output file
# (--save, --metrics). Covers the IDX reader (mnist_mlp --data), the CIFAR-10 reader (cifar_cnn
# --data) and the safetensors reader (mnist_mlp --init).
# Usage: corrupt_inputs.sh path/to/mnist_mlp path/to/cifar_cnn
set -u
mlp=$1 cnn=$2
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cases=0
synthetic_idx "$tmp/good" 20 10

# check NAME WANT... -- CMD...: exit 1, one stderr line holding every WANT, no output files.
check() {
  local name=$1
  shift
  local want=()
  while [ "$1" != -- ]; do
    want+=("$1")
    shift
  done
  shift
  cases=$((cases + 1))
  rm -f "$tmp/out.safetensors" "$tmp/metrics.jsonl"
  "$@" --save "$tmp/out.safetensors" --metrics "$tmp/metrics.jsonl" >/dev/null 2>"$tmp/err"
  local rc=$? problem=""
  [ "$rc" -eq 1 ] || problem="exit $rc"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || problem+=" $(wc -l <"$tmp/err") stderr lines"
  for w in "${want[@]}"; do grep -qF -- "$w" "$tmp/err" || problem+=" no '$w'"; done
  [ ! -e "$tmp/out.safetensors" ] || problem+=" --save written"
  [ ! -e "$tmp/metrics.jsonl" ] || problem+=" --metrics written"
  if [ -n "$problem" ]; then
    echo "FAIL $name:$problem: $(cat "$tmp/err")"
    fails=$((fails + 1))
  else
    echo "ok   $name: $(sed "s|$tmp/||g" "$tmp/err")"
  fi
}

# idx_case NAME FILE WANT...: a copy of the good set with FILE (train images or labels) replaced
# by $tmp/bad, run through mnist_mlp.
idx_case() {
  local name=$1 file=$2
  shift 2
  rm -rf "$tmp/set" && cp -r "$tmp/good" "$tmp/set"
  rm -rf "$tmp/set/$file" && cp -r "$tmp/bad" "$tmp/set/$file"
  check "idx $name" "$tmp/set/$file" "$@" -- "$mlp" --data "$tmp/set" --epochs 1 --threads 1
}
images=$tmp/good/train-images-idx3-ubyte labels=$tmp/good/train-labels-idx1-ubyte
isize=$(stat -c %s "$images") lsize=$(stat -c %s "$labels")
for at in 0 3 4 9 15 16 17 100 $((isize - 1)); do
  head -c "$at" "$images" >"$tmp/bad"
  idx_case "images cut at $at" train-images-idx3-ubyte "truncated IDX image file" "file has only $at bytes"
done
for at in 0 5 8 $((lsize - 1)); do
  head -c "$at" "$labels" >"$tmp/bad"
  idx_case "labels cut at $at" train-labels-idx1-ubyte "truncated IDX label file" "file has only $at bytes"
done
{ cat "$images"; printf 'xyz'; } >"$tmp/bad"
idx_case "trailing bytes" train-images-idx3-ubyte "trailing bytes in IDX image file" "3 unexpected bytes at offset $isize"
for magic in '\x12\x34\x56\x78' '\x00\x00\x08\x04' '\x00\x00\x0d\x03' '\x00\x00\x08\x01'; do
  { printf "$magic"; tail -c +5 "$images"; } >"$tmp/bad"
  idx_case "image magic $magic" train-images-idx3-ubyte "at offset 0"
done
{ head -c 8 "$labels"; printf '\x01\x02\x0a'; tail -c +12 "$labels"; } >"$tmp/bad"
idx_case "label 10" train-labels-idx1-ubyte "label out of range" "sample 2 at byte offset 10 has label 10, expected 0..9"
{ printf '\x00\x00\x08\x01\x00\x00\x00\x13'; tail -c +9 "$labels" | head -c 19; } >"$tmp/bad"
idx_case "19 labels for 20 images" train-labels-idx1-ubyte "holds 20 images but label file" "holds 19 labels"
gzip -c "$images" | head -c 40 >"$tmp/bad"
idx_case "gzip cut short" train-images-idx3-ubyte "corrupt gzip stream"
rm -rf "$tmp/bad" && mkdir "$tmp/bad"
idx_case "directory" train-images-idx3-ubyte "it is a directory, expected a file"
# Inputs without a size to check a header against, or far larger than the header says: each
# ends at once (the test's TIMEOUT bounds it), naming the file, without reading the body.
rm -rf "$tmp/bad" && mkfifo "$tmp/bad"
idx_case "FIFO without a writer" train-images-idx3-ubyte "it is a FIFO (named pipe), expected a regular file"
rm -rf "$tmp/bad" && ln -s /dev/zero "$tmp/bad"
idx_case "/dev/zero" train-images-idx3-ubyte "it is a character device, expected a regular file"
rm -rf "$tmp/bad" && cp "$images" "$tmp/bad" && truncate -s 1T "$tmp/bad"
idx_case "1 TiB sparse file" train-images-idx3-ubyte "trailing bytes in IDX image file" \
  "unexpected bytes at offset $isize" "found 1099511627776"
# A gzip bomb: the good images, then 256 MiB of zeros in about 250 KiB; inflated to the header's
# size + 1 byte only.
rm -rf "$tmp/bad" && { cat "$images"; head -c 256M /dev/zero; } | gzip -9 >"$tmp/bad"
idx_case "gzip bomb" train-images-idx3-ubyte "(gzip; offsets count decompressed bytes): unexpected bytes from offset $isize" \
  "found more (read no further)"

# CIFAR-10: data_batch_1.bin of 10000 records (a sparse file of zeros, then patched).
cifar_case() {
  local name=$1
  shift
  check "cifar $name" "$tmp/cifar/data_batch_1.bin" "$@" -- "$cnn" --data "$tmp/cifar" --epochs 1 --threads 1
}
mkdir -p "$tmp/cifar"
# The other files only need to exist: data_batch_1.bin is read first.
touch "$tmp/cifar/"{data_batch_2,data_batch_3,data_batch_4,data_batch_5,test_batch}.bin
record=3073
for size in 0 1 $record $((record * 10000 - 1)) $((record * 10000 + 5)); do
  rm -f "$tmp/cifar/data_batch_1.bin" && truncate -s "$size" "$tmp/cifar/data_batch_1.bin"
  cifar_case "$size bytes" "CIFAR-10"
done
truncate -s $((record * 10000)) "$tmp/cifar/data_batch_1.bin"
printf '\x0b' | dd of="$tmp/cifar/data_batch_1.bin" bs=1 seek=$((record * 7)) conv=notrunc 2>/dev/null
cifar_case "label 11 in record 7" "label" "offset $((record * 7))"
printf '\x00' | dd of="$tmp/cifar/data_batch_1.bin" bs=1 seek=$((record * 7)) conv=notrunc 2>/dev/null
gzip -c "$tmp/cifar/data_batch_1.bin" | head -c 1000 >"$tmp/cifar/data_batch_1.bin.gz"
rm "$tmp/cifar/data_batch_1.bin"
cifar_case "gzip cut short" "corrupt gzip stream"

# safetensors through --init: a good file to corrupt (the MLP's parameters), then variants.
"$mlp" --data "$tmp/good" --epochs 1 --threads 1 --hidden 8 --save "$tmp/params.safetensors" \
  >/dev/null 2>&1 || { echo "FAIL could not write a checkpoint to corrupt"; exit 1; }
good=$tmp/params.safetensors gsize=$(stat -c %s "$tmp/params.safetensors")
st_case() {
  local name=$1
  shift
  check "safetensors $name" "$tmp/bad.safetensors" "$@" -- "$mlp" --data "$tmp/good" --epochs 1 \
    --threads 1 --hidden 8 --init "$tmp/bad.safetensors"
}
for at in 0 7 8 20 $((gsize - 1)); do
  head -c "$at" "$good" >"$tmp/bad.safetensors"
  st_case "cut at $at"
done
{ printf '\xff\xff\xff\xff\x00\x00\x00\x00'; tail -c +9 "$good"; } >"$tmp/bad.safetensors"
st_case "header length past the end" "header length"
{ head -c 8 "$good"; printf '{{{'; tail -c +12 "$good"; } >"$tmp/bad.safetensors"
st_case "bad JSON" "bad JSON header"
sed 's/"F32"/"Q99"/' "$good" >"$tmp/bad.safetensors"
st_case "unknown dtype" "field 'dtype' is 'Q99'"
"$mlp" --data "$tmp/good" --epochs 1 --threads 1 --hidden 4 --save "$tmp/other.safetensors" >/dev/null 2>&1
cp "$tmp/other.safetensors" "$tmp/bad.safetensors"
st_case "another model" "fc1.weight" "[8,64]" "[4,64]"
rm -f "$tmp/bad.safetensors" && mkdir "$tmp/bad.safetensors"
st_case "directory" "it is a directory"
rmdir "$tmp/bad.safetensors"
ln -s /dev/zero "$tmp/bad.safetensors"
st_case "/dev/zero" "it is a character device"
rm -f "$tmp/bad.safetensors" && mkfifo "$tmp/bad.safetensors"
st_case "FIFO without a writer" "it is a FIFO (named pipe)"
rm -f "$tmp/bad.safetensors"
# A header nested 100000 deep (would overflow the stack of a recursive parser), and a tensor
# name with a newline and a terminal escape (the message stays one printable line).
deep=$(printf '%*s' 100000 '' | tr ' ' '[')$(printf '%*s' 100000 '' | tr ' ' ']')
header="{\"__metadata__\":$deep}"
{ printf "$(printf '\\x%02x' $((${#header} & 255)) $((${#header} >> 8 & 255)) $((${#header} >> 16 & 255)) 0 0 0 0 0)"; printf '%s' "$header"; } >"$tmp/bad.safetensors"
st_case "nested 100000 deep" "nests arrays and objects more than 32 deep"
header='{"fc1.weight\n\u001b[2J":{"dtype":"F32","shape":[8,64],"data_offsets":[0,5]}}'
{ printf "$(printf '\\x%02x' ${#header} 0 0 0 0 0 0 0)"; printf '%s' "$header"; head -c 5 /dev/zero; } >"$tmp/bad.safetensors"
st_case "control characters in a name" "tensor 'fc1.weight\x0A\x1B[2J'"
rm -f "$tmp/bad.safetensors"
st_case "missing" "does not exist"

echo "$cases corrupt inputs, $fails failed"
exit $((fails > 0))
