#!/usr/bin/env bash
# Numerical faults: a NaN written into the output layer's bias after step 3 (testing hook
# MINIDL_TEST_NAN_AFTER_STEP) stops training at step 4, every step's loss check naming the step
# and pointing at --check-numerics, and --check-numerics naming the first node that produced a
# NaN, with its op and the parameter it read. The run exits non-zero, saves nothing, leaves the
# checkpoint of step 3 as the newest, and that checkpoint resumes to the uninterrupted result.
# Usage: numerics.sh path/to/mnist_mlp
set -u
bin=$1
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 200 40 # batches of 32: 7 steps per epoch

run() {
  "$bin" --data "$tmp/data" --hidden 16 --epochs 2 --batch-size 32 --threads 1 --lr 0.05 "$@"
}

run --save "$tmp/A.safetensors" >"$tmp/A.out" 2>&1 || { fail "uninterrupted run"; cat "$tmp/A.out"; }

# nan NAME [FLAGS]: inject after step 3, checkpoint every step; prints stderr to $tmp/NAME.err.
nan() {
  local name=$1
  shift
  MINIDL_TEST_NAN_AFTER_STEP=3 run --checkpoint-dir "$tmp/$name-ck" --checkpoint-every-steps 1 \
    --checkpoint-keep 10 --save "$tmp/$name.safetensors" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  [ "$rc" -ne 0 ] || fail "$name: the run with a NaN exited 0"
  [ "$(wc -l <"$tmp/$name.err")" -eq 1 ] || fail "$name: wanted one error line, got: $(cat "$tmp/$name.err")"
  [ ! -e "$tmp/$name.safetensors" ] || fail "$name: the failed run saved its parameters"
  local newest
  newest=$(cd "$tmp/$name-ck" && ls | tail -1)
  [ "$newest" = ckpt-e0000-s000003.safetensors ] ||
    fail "$name: newest checkpoint is '$newest', wanted the last good one, of step 3"
  ! ls "$tmp/$name-ck" | grep -q '\.tmp' || fail "$name: a temporary checkpoint file was left"
}

nan loss
grep -q "error: training step 4 (epoch 1, step 4 of the epoch): the loss over this rank's 32 samples is nan; --check-numerics names the first node that produced a NaN or Inf" "$tmp/loss.err" &&
  echo "ok   loss check: $(cat "$tmp/loss.err")" || fail "loss check: $(cat "$tmp/loss.err")"

nan numerics --check-numerics
grep -q "error: training step 4 (epoch 1, step 4 of the epoch): check-numerics: matmul 'fc2.matmul+bias' (%[0-9]*) produced NaN at element 0 of output 0 \[32,10\]; its inputs: %[0-9]* (fc1.[a-z+]*) finite, %[0-9]* (fc2.weight) finite, %[0-9]* (fc2.bias) has NaN at element 0" "$tmp/numerics.err" &&
  echo "ok   check-numerics: $(cat "$tmp/numerics.err")" || fail "check-numerics: $(cat "$tmp/numerics.err")"

# The last good checkpoint resumes to the uninterrupted run's parameters.
if run --resume "$tmp/numerics-ck" --save "$tmp/resumed.safetensors" >"$tmp/resumed.out" 2>&1 &&
  cmp -s "$tmp/A.safetensors" "$tmp/resumed.safetensors"; then
  echo "ok   resumed from the last good checkpoint: bitwise the uninterrupted run"
else
  fail "resume from the last good checkpoint: $(cat "$tmp/resumed.out")"
fi
exit $((fails > 0))
