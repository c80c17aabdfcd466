#!/usr/bin/env bash
# --augment and the prefetch thread through the app: in deterministic mode an augmented run gives
# byte-identical parameters on 1 and 2 ranks, with and without the prefetch thread (which a
# process bound to one CPU does without), mnist_cnn on synthetic 8x8 images, also killed
# mid-epoch on 2 ranks and resumed on 1; cifar_cnn on a few
# hundred CIFAR-10 samples when CIFAR_DIR holds them);
# --metrics and --profile show the data times and the setting; an error while preparing a batch
# (the MINIDL_TEST_FAIL_PREPARE_AT_STEP hook) ends the run, or the job, with one line and a
# non-zero exit, quickly.
# Usage: augment.sh path/to/mnist_cnn path/to/cifar_cnn path/to/mpirun [CIFAR_DIR]
set -u
cnn=$1 cifar=$2 mpirun=$3 cifar_dir=${4:-}
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 200 40 # batches of 32: 6 full, then 8 (2 micro-shards of 4)

launch() {
  local ranks=$1
  shift
  on_layout "$ranks" 1 "$@"
}

# same NAME A B: the parameter files A and B are byte-identical.
same() {
  if cmp -s "$2" "$3"; then
    echo "ok   $1"
  else
    fail "$1: parameters differ"
  fi
}

flags=(--data "$tmp/data" --epochs 2 --lr 0.05 --seed 3 --threads 1 --deterministic
  --micro-batch 4 --augment crop,flip)
for run in 1:prefetch 2:prefetch 1:main; do
  ranks=${run%:*} how=${run#*:}
  extra=()
  [ "$how" = main ] && extra=(--no-prefetch)
  if ! launch "$ranks" "$cnn" "${flags[@]}" "${extra[@]}" --save "$tmp/cnn-$ranks-$how.safetensors" \
    --metrics "$tmp/cnn-$ranks-$how.jsonl" --profile >"$tmp/cnn-$ranks-$how.out" 2>&1; then
    fail "mnist_cnn on $ranks rank(s), $how: the run failed:"
    cat "$tmp/cnn-$ranks-$how.out"
  fi
done
same "mnist_cnn --augment crop,flip: 2 ranks bitwise 1 rank" "$tmp/cnn-1-prefetch.safetensors" \
  "$tmp/cnn-2-prefetch.safetensors"
same "mnist_cnn --augment crop,flip: --no-prefetch bitwise the prefetch thread" \
  "$tmp/cnn-1-prefetch.safetensors" "$tmp/cnn-1-main.safetensors"
# The augmentation did something: without it, other parameters.
launch 1 "$cnn" "${flags[@]/crop,flip/none}" --save "$tmp/cnn-plain.safetensors" >/dev/null 2>&1
cmp -s "$tmp/cnn-1-prefetch.safetensors" "$tmp/cnn-plain.safetensors" &&
  fail "mnist_cnn: --augment crop,flip trained the same parameters as none"

# Killed after step 9 (mid-epoch 2) on 2 ranks with a checkpoint there, resumed on 1 rank: the
# augmentation draws the rest of the epoch again, bitwise the uninterrupted run.
launch 2 env MINIDL_TEST_KILL_AFTER_STEP=9 "$cnn" "${flags[@]}" --checkpoint-dir "$tmp/ck" \
  --checkpoint-every-steps 9 >"$tmp/killed.out" 2>&1 && fail "the run meant to die after step 9 exited 0"
if launch 1 "$cnn" "${flags[@]}" --resume "$tmp/ck" --save "$tmp/cnn-resumed.safetensors" \
  >"$tmp/resumed.out" 2>&1; then
  grep -q "resumed from .*(training step 9)" "$tmp/resumed.out" ||
    fail "did not resume from the checkpoint of step 9: $(cat "$tmp/resumed.out")"
  same "mnist_cnn --augment crop,flip: killed at step 9 on 2 ranks, resumed on 1: bitwise" \
    "$tmp/cnn-1-prefetch.safetensors" "$tmp/cnn-resumed.safetensors"
else
  fail "the resumed run failed: $(cat "$tmp/resumed.out")"
fi

# --metrics: the setting in the config record, the data times in every epoch's record.
/usr/bin/python3 - "$tmp/cnn-1-prefetch.jsonl" "$tmp/cnn-1-main.jsonl" <<'PY' || fails=$((fails + 1))
import json, sys
bad = []
for path, prefetch in zip(sys.argv[1:], (True, False)):
    lines = [json.loads(l) for l in open(path)]
    config = lines[0]["config"]
    if config.get("augment") != "crop,flip" or config.get("prefetch") is not prefetch:
        bad.append(f"{path}: config has augment {config.get('augment')!r}, prefetch {config.get('prefetch')!r}")
    for r in (r for r in lines[1:] if "epoch" in r):
        if not (r.get("data_prepare_seconds", 0) > 0 and r.get("data_wait_seconds", -1) >= 0):
            bad.append(f"{path}: epoch {r.get('epoch')} lacks the data times: {r}")
for b in bad:
    print("FAIL", b)
sys.exit(1 if bad else 0)
PY
# --profile: the epoch line splits off the data time, and the summary says how much was hidden.
grep -qE "^ +compute [0-9.]+ s .* data [0-9.]+ s \(preparing [0-9.]+ s on the prefetch thread\)$" \
  "$tmp/cnn-1-prefetch.out" || fail "--profile: no data time in the epoch line: $(cat "$tmp/cnn-1-prefetch.out")"
grep -qE "^data \(training batches, rank 0\): the steps waited [0-9.]+ s for their batches; preparing them \(gather, augment crop,flip\) took [0-9.]+ s on the prefetch thread, [0-9]+% of it hidden$" \
  "$tmp/cnn-1-prefetch.out" || fail "--profile: no data summary: $(cat "$tmp/cnn-1-prefetch.out")"
grep -q "on the main thread (--no-prefetch)$" "$tmp/cnn-1-main.out" ||
  fail "--profile --no-prefetch: no data summary"
# A process that may run on one CPU only (as an mpirun rank bound to a core) prepares its batches
# on the main thread by itself: it says so, records it, and trains the same bits.
if command -v taskset >/dev/null; then
  taskset -c 0 "$cnn" "${flags[@]}" --save "$tmp/cnn-1-cpu.safetensors" \
    --metrics "$tmp/cnn-1-cpu.jsonl" --profile >"$tmp/cnn-1-cpu.out" 2>&1 ||
    fail "mnist_cnn on one CPU: the run failed: $(cat "$tmp/cnn-1-cpu.out")"
  grep -q "on the main thread (no CPU left for a prefetch thread: 1 compute thread(s) on 1 CPU(s))$" "$tmp/cnn-1-cpu.out" ||
    fail "mnist_cnn on one CPU: the batches were not prepared on the main thread: $(cat "$tmp/cnn-1-cpu.out")"
  grep -q '"prefetch":false' "$tmp/cnn-1-cpu.jsonl" ||
    fail "mnist_cnn on one CPU: the metrics' config does not say prefetch false"
  same "mnist_cnn --augment crop,flip on one CPU (batches on the main thread) bitwise the prefetch thread" \
    "$tmp/cnn-1-prefetch.safetensors" "$tmp/cnn-1-cpu.safetensors"
else
  echo "skip one CPU: no taskset"
fi

# cifar_cnn on 256 CIFAR-10 samples (3x32x32: the crop of the 40x40 padded image), if present.
if [ -n "$cifar_dir" ] && { [ -e "$cifar_dir/test_batch.bin" ] || [ -e "$cifar_dir/test_batch.bin.gz" ]; }; then
  cflags=(--data "$cifar_dir" --train-limit 256 --test-limit 100 --epochs 1 --seed 5 --threads 1
    --deterministic --micro-batch 8 --augment crop,flip)
  for ranks in 1 2; do
    launch "$ranks" "$cifar" "${cflags[@]}" --save "$tmp/cifar-$ranks.safetensors" \
      >"$tmp/cifar-$ranks.out" 2>&1 || { fail "cifar_cnn on $ranks rank(s):"; cat "$tmp/cifar-$ranks.out"; }
  done
  same "cifar_cnn --augment crop,flip: 2 ranks bitwise 1 rank" "$tmp/cifar-1.safetensors" \
    "$tmp/cifar-2.safetensors"
else
  echo "skip cifar_cnn: no CIFAR-10 data given"
fi

# An error while preparing the batch of step 3: one line, non-zero exit, within seconds, on one
# rank (the prefetch thread and the main thread) and on two.
for run in 1: 1:--no-prefetch 2:; do
  ranks=${run%%:*} extra=${run#*:}
  start=$(date +%s)
  # shellcheck disable=SC2086
  launch "$ranks" env MINIDL_TEST_FAIL_PREPARE_AT_STEP=3 \
    "$cnn" --data "$tmp/data" --epochs 1 --threads 1 --augment crop $extra \
    --save "$tmp/failed.safetensors" >"$tmp/failed.out" 2>"$tmp/failed.err"
  rc=$?
  took=$(($(date +%s) - start))
  want="training step 3 (epoch 1, step 3 of the epoch): preparing the batch of training step 3 failed"
  errors=$(grep -c "error" "$tmp/failed.err")
  if [ "$rc" -eq 0 ] || ! grep -qF "$want" "$tmp/failed.err" || [ "$took" -gt 30 ] ||
    [ -e "$tmp/failed.safetensors" ] || grep -q "terminate" "$tmp/failed.err"; then
    fail "a failing preparation on $ranks rank(s) $extra: exit $rc after ${took} s: $(cat "$tmp/failed.err")"
  elif [ "$ranks" -eq 1 ] && [ "$(wc -l <"$tmp/failed.err")" -ne 1 ]; then
    fail "a failing preparation $extra: more than one line: $(cat "$tmp/failed.err")"
  else
    echo "ok   a failing preparation on $ranks rank(s) $extra: exit $rc in ${took} s, $errors error line(s)"
  fi
done
exit $((fails > 0))
