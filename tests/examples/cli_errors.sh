#!/usr/bin/env bash
# The example's bad inputs end in exactly one line on stderr that names the problem, a non-zero
# exit, and no output file. Usage: cli_errors.sh path/to/mnist_mlp
set -u
bin=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# expect NAME SUBSTRING CMD...: non-zero exit, one stderr line containing SUBSTRING.
expect() {
  local name=$1 want=$2
  shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
    echo "FAIL $name: exit $rc, $lines stderr lines, wanted '$want':"
    cat "$tmp/err"
    fails=$((fails + 1))
  else
    echo "ok   $name: $(cat "$tmp/err")"
  fi
}

# A small valid IDX set to corrupt: 4 images of 2x2, 4 labels.
mkdir -p "$tmp/good"
printf '\x00\x00\x08\x03\x00\x00\x00\x04\x00\x00\x00\x02\x00\x00\x00\x02' >"$tmp/good/train-images-idx3-ubyte"
head -c 16 /dev/zero >>"$tmp/good/train-images-idx3-ubyte"
printf '\x00\x00\x08\x01\x00\x00\x00\x04\x00\x01\x02\x03' >"$tmp/good/train-labels-idx1-ubyte"
cp "$tmp/good/train-images-idx3-ubyte" "$tmp/good/t10k-images-idx3-ubyte"
cp "$tmp/good/train-labels-idx1-ubyte" "$tmp/good/t10k-labels-idx1-ubyte"

mkdir -p "$tmp/bad"
cp "$tmp/good/"* "$tmp/bad/"
printf '\x00\x00\x08\x04' | dd of="$tmp/bad/train-images-idx3-ubyte" conv=notrunc 2>/dev/null

mkdir -p "$tmp/short"
cp "$tmp/good/"* "$tmp/short/"
truncate -s 20 "$tmp/short/train-images-idx3-ubyte"

expect missing-dir "does not exist" "$bin" --data "$tmp/nope" --save "$tmp/missing.safetensors"
expect wrong-magic "train-images-idx3-ubyte" "$bin" --data "$tmp/bad" --save "$tmp/bad.safetensors"
expect wrong-magic-says-magic "magic" "$bin" --data "$tmp/bad"
expect truncated "truncated" "$bin" --data "$tmp/short"
expect bad-activation "--activation" "$bin" --activation gelu
expect bad-dataset "--dataset" "$bin" --dataset cifar
expect bad-epochs "--epochs" "$bin" --epochs 0
expect bad-lr "--lr" "$bin" --lr -1
expect bad-hidden "--hidden" "$bin" --hidden 256,abc --data "$tmp/good"
expect unknown-flag "--bogus" "$bin" --bogus
expect bad-denormals "--denormals" "$bin" --denormals zero
for bad in rotate flip,crop crop, "crop flip" CROP; do
  expect "bad-augment '$bad'" \
    "--augment: augmentation '$bad' is not one of none (or empty), crop, flip, crop,flip" \
    "$bin" --augment "$bad"
done

# Models and batches that cannot fit are refused before training, with the size they need:
# a layer of 10^11 units, and (60000 one-pixel images) a batch of 60000 with 10^6 hidden units.
expect huge-model "a tensor of shape [100000000000,4] f32 needs 1490.1 GiB, more than the" \
  "$bin" --data "$tmp/good" --hidden 100000000000
mkdir -p "$tmp/tiny"
{ printf '\x00\x00\x08\x03\x00\x00\xea\x60\x00\x00\x00\x01\x00\x00\x00\x01'; head -c 60000 /dev/zero; } \
  >"$tmp/tiny/train-images-idx3-ubyte"
{ printf '\x00\x00\x08\x01\x00\x00\xea\x60'; head -c 60000 /dev/zero; } >"$tmp/tiny/train-labels-idx1-ubyte"
# The test set holds images of the same size (1x1): a test set of another size is refused first.
{ printf '\x00\x00\x08\x03\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x01'; head -c 4 /dev/zero; } \
  >"$tmp/tiny/t10k-images-idx3-ubyte"
cp "$tmp/good/t10k-labels-idx1-ubyte" "$tmp/tiny/"
expect huge-batch "compiling the training graph for 60000 samples: the graph (" \
  "$bin" --data "$tmp/tiny" --hidden 1000000 --batch-size 60000 --threads 1

# The good set trains (one epoch) and saves; the failing runs above left no file.
"$bin" --data "$tmp/good" --epochs 1 --batch-size 2 --save "$tmp/ok.safetensors" >/dev/null 2>&1 ||
  { echo "FAIL good data did not train"; fails=$((fails + 1)); }
[ -s "$tmp/ok.safetensors" ] || { echo "FAIL no saved file"; fails=$((fails + 1)); }
for f in missing bad; do
  [ ! -e "$tmp/$f.safetensors" ] || { echo "FAIL $f.safetensors was written"; fails=$((fails + 1)); }
done
exit $((fails > 0))
