#!/usr/bin/env bash
# Outputs and the end of a run: every output is checked before the data are read and nothing is
# created by a refused run; any exception (not only minidl's own) ends in one line naming what
# the run was doing; paths that are not UTF-8 are written escaped into the metrics; the test
# set's sample shape is checked against the training set's when loaded.
# With a launcher (mpirun -np 2 ...), the same on every rank of a job: an error while setting up
# goes through the preflight (one line from rank 0 naming the ranks that could not start), an
# error in training is one line naming its rank; the job ends, and a refused run leaves no file.
# Usage: robust_outputs.sh path/to/mnist_mlp [LAUNCHER...]
set -u
bin=$1
shift
launcher=("$@")
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/good" 16 8

if [ ${#launcher[@]} -gt 0 ]; then
  mkdir -p "$tmp/mixed" && cp "$tmp/good/"* "$tmp/mixed/"
  printf '\x00\x00\x08\x03\x00\x00\x00\x08\x00\x00\x00\x07\x00\x00\x00\x07' >"$tmp/mixed/t10k-images-idx3-ubyte"
  head -c $((8 * 49)) /dev/zero >>"$tmp/mixed/t10k-images-idx3-ubyte"
  # ranked NAME PREFIX WANT -- ARGS...: a non-zero exit, WANT on a line of its own that begins
  # with PREFIX (a regular expression: the rank, or the ranks that could not start), the only
  # error line when it comes from the preflight, no uncaught exception, nothing in $tmp/out.
  ranked() {
    local name=$1 prefix=$2 want=$3
    shift 4
    rm -rf "$tmp/out" && mkdir "$tmp/out"
    "${launcher[@]}" "$@" >"$tmp/stdout" 2>"$tmp/err"
    local rc=$? problem=""
    [ "$rc" -ne 0 ] || problem="exit 0"
    grep -qE "^mnist_mlp: error$prefix.*$(printf '%s' "$want" | sed 's/[][\.*^$/]/\\&/g')" "$tmp/err" ||
      problem+=" no line with '$want'"
    case $prefix in
      *"could not start"*)
        [ "$(grep -c ': error' "$tmp/err")" -eq 1 ] || problem+=" $(grep -c ': error' "$tmp/err") error lines"
        ;;
    esac
    ! grep -q "terminate called" "$tmp/err" || problem+=" an uncaught exception"
    [ -z "$(ls -A "$tmp/out")" ] || problem+=" left $(ls -A "$tmp/out" | tr '\n' ' ')"
    if [ -n "$problem" ]; then
      fail "$name:$problem: $(cat "$tmp/err")"
    else
      echo "ok   $name: $(grep -m1 'error' "$tmp/err" | sed "s|$tmp/||g")"
    fi
  }
  on_rank=" on rank [0-9]+: " setting_up=": rank\(s\) [0-9, ]+ of [0-9]+ could not start: "
  ranked "std::out_of_range on every rank" "$on_rank" "while training epoch 1: stoll" -- \
    env MINIDL_TEST_THROW_AT_STEP=2 "$bin" --epochs 1 --threads 1 --hidden 4 --batch-size 2 --data "$tmp/good"
  ranked "--save in a missing directory" "$setting_up" "--save: cannot write '$tmp/out/none/p.safetensors'" -- \
    "$bin" --epochs 1 --threads 1 --hidden 4 --data "$tmp/good" --save "$tmp/out/none/p.safetensors"
  ranked "test images of another size" "$setting_up" "test images [1,7,7] in '$tmp/mixed/t10k-images-idx3-ubyte'" -- \
    "$bin" --epochs 1 --threads 1 --hidden 4 --data "$tmp/mixed" --save "$tmp/out/p.safetensors" \
    --metrics "$tmp/out/m.jsonl" --checkpoint-dir "$tmp/out/ckpt" --dump-graph "$tmp/out/g.txt"
  [ "$fails" -eq 0 ] && echo "robust_outputs ok (${launcher[*]})"
  exit $((fails > 0))
fi

# expect NAME WANT... -- CMD...: exit 1 (2 for a flag's own check), one stderr line holding every
# WANT, and nothing new in $tmp/out.
expect() {
  local name=$1 code=1
  shift
  [ "$1" = --code ] && { code=$2; shift 2; }
  local want=()
  while [ "$1" != -- ]; do
    want+=("$1")
    shift
  done
  shift
  rm -rf "$tmp/out" && mkdir "$tmp/out"
  "$@" >"$tmp/stdout" 2>"$tmp/err"
  local rc=$? problem=""
  [ "$rc" -eq "$code" ] || problem="exit $rc"
  [ "$(wc -l <"$tmp/err")" -eq 1 ] || problem+=" $(wc -l <"$tmp/err") stderr lines"
  for w in "${want[@]}"; do grep -qF -- "$w" "$tmp/err" || problem+=" no '$w'"; done
  [ -z "$(ls -A "$tmp/out")" ] || problem+=" left $(ls -A "$tmp/out" | tr '\n' ' ')"
  if [ -n "$problem" ]; then
    fail "$name:$problem: $(cat "$tmp/err")"
  else
    echo "ok   $name: $(sed "s|$tmp/||g" "$tmp/err")"
  fi
}
run() { "$bin" --epochs 1 --threads 1 --hidden 4 --batch-size 4 "$@"; }
all_outputs=(--save "$tmp/out/p.safetensors" --metrics "$tmp/out/m.jsonl" --trace "$tmp/out/t.json"
  --dump-graph "$tmp/out/g.txt" --checkpoint-dir "$tmp/out/ckpt")

# Class 4: unwritable outputs are refused before the data are read (the data directory given
# does not exist, and the error is the output's), and leave nothing.
mkdir -p "$tmp/adir" && touch "$tmp/afile"
expect "--save in a missing directory" "--save: cannot write '$tmp/out/none/p.safetensors': the directory '$tmp/out/none' does not exist" \
  -- run --data "$tmp/nowhere" --save "$tmp/out/none/p.safetensors"
expect "--metrics a directory" "--metrics: cannot write '$tmp/adir': it is a directory" \
  -- run --data "$tmp/nowhere" --metrics "$tmp/adir"
expect "--trace where no file can be made" "--trace: cannot write '/proc/t.json': cannot create a file in '/proc'" \
  -- run --data "$tmp/nowhere" --trace /proc/t.json
expect "--dump-graph under a file" "--dump-graph: cannot write '$tmp/afile/g.txt': '$tmp/afile' is not a directory" \
  -- run --data "$tmp/nowhere" --dump-graph "$tmp/afile/g.txt"
expect "--checkpoint-dir under a file" "--checkpoint-dir: cannot write in '$tmp/afile/ckpt': '$tmp/afile' is not a directory" \
  -- run --data "$tmp/nowhere" --checkpoint-dir "$tmp/afile/ckpt"
expect "--checkpoint-dir in /proc" "--checkpoint-dir: cannot write in '/proc/ckpt': cannot create a file in '/proc'" \
  -- run --data "$tmp/nowhere" --checkpoint-dir /proc/ckpt

# Runs refused after the outputs were checked create none of them: a test set whose images
# differ in size from the training set's (found when the data are loaded), parameters of
# another model (--init), and an exception thrown at the first step.
cp -r "$tmp/good" "$tmp/mixed"
synthetic_idx "$tmp/other" 16 8
printf '\x00\x00\x08\x03\x00\x00\x00\x08\x00\x00\x00\x07\x00\x00\x00\x07' >"$tmp/mixed/t10k-images-idx3-ubyte"
head -c $((8 * 49)) /dev/zero >>"$tmp/mixed/t10k-images-idx3-ubyte"
expect "test images of another size" "test images [1,7,7] in '$tmp/mixed/t10k-images-idx3-ubyte' differ from the training images [1,8,8] in '$tmp/mixed/train-images-idx3-ubyte'" \
  -- run --data "$tmp/mixed" "${all_outputs[@]}"
"$bin" --epochs 1 --threads 1 --hidden 5 --data "$tmp/good" --save "$tmp/h5.safetensors" \
  >/dev/null 2>&1 || fail "a run to save parameters"
expect "--init of another model" "fc1.weight" -- run --data "$tmp/good" --init "$tmp/h5.safetensors" "${all_outputs[@]}"
# Class 1: an exception that is not minidl's own (std::stoll's std::out_of_range) ends the run
# with one line saying what it was doing (after the first step: the outputs exist by then, and
# are not asked for here).
expect "std::out_of_range at step 2" "mnist_mlp: error: while training epoch 1: stoll" \
  -- env MINIDL_TEST_THROW_AT_STEP=2 "$bin" --epochs 1 --threads 1 --hidden 4 --batch-size 4 \
  --data "$tmp/good"

# Class 1: checkpoint names with counts past 64 bits (std::stoll threw, and the run aborted).
mkdir -p "$tmp/ck"
touch "$tmp/ck/ckpt-e99999999999999999999-s000001.safetensors"
expect "a checkpoint name past 64 bits" "checkpoint directory '$tmp/ck': the counts in the name of 'ckpt-e99999999999999999999-s000001.safetensors' are too large" \
  -- run --data "$tmp/good" --resume "$tmp/ck"

# Class 1: a program, a data directory and a resumed checkpoint whose names are not UTF-8: the
# runs train, and the metrics hold the names escaped ("\xFF" as text; JSON writers refuse the
# raw byte, and the run ended in an uncaught exception).
bad_name=$(printf 'x-\xff\xfe')
cp -r "$tmp/good" "$tmp/data-$bad_name"
ln -s "$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")" "$tmp/mlp-$bad_name"
"$tmp/mlp-$bad_name" --epochs 1 --threads 1 --hidden 4 --batch-size 4 --data "$tmp/data-$bad_name" \
  --checkpoint-dir "$tmp/ck-$bad_name" --metrics "$tmp/m1.jsonl" >/dev/null 2>"$tmp/err" ||
  fail "a program and data directory not in UTF-8: $(cat "$tmp/err")"
grep -qF '"program":"mlp-x-\\xFF\\xFE"' "$tmp/m1.jsonl" ||
  fail "the metrics do not hold the program's name escaped: $(head -c 600 "$tmp/m1.jsonl")"
"$bin" --epochs 2 --threads 1 --hidden 4 --batch-size 4 --data "$tmp/data-$bad_name" \
  --resume "$tmp/ck-$bad_name" --metrics "$tmp/m2.jsonl" \
  >/dev/null 2>"$tmp/err" || fail "resuming from a directory not in UTF-8: $(cat "$tmp/err")"
grep -qF "\"resume\":\"$tmp/ck-x-\\\\xFF\\\\xFE/ckpt-e0001-s000000.safetensors\"" "$tmp/m2.jsonl" ||
  fail "the metrics do not hold the resumed checkpoint escaped: $(head -c 600 "$tmp/m2.jsonl")"

# A viable run writes every output, and leaves no temporary file.
rm -rf "$tmp/out" && mkdir "$tmp/out"
run --data "$tmp/good" "${all_outputs[@]}" >/dev/null 2>"$tmp/err" || fail "a good run: $(cat "$tmp/err")"
for f in p.safetensors m.jsonl t.json g.txt ckpt/ckpt-e0001-s000000.safetensors; do
  [ -s "$tmp/out/$f" ] || fail "a good run did not write $f"
done
! find "$tmp/out" -name '*.tmp*' | grep -q . || fail "temporary files left: $(find "$tmp/out" -name '*.tmp*')"

[ "$fails" -eq 0 ] && echo "robust_outputs ok"
exit $((fails > 0))
