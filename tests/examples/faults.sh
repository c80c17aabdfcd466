#!/usr/bin/env bash
# Distributed faults on 2 ranks: a rank killed mid-epoch ends the whole job quickly with a
# non-zero exit and leaves the last checkpoint intact, from which a resumed run ends bitwise
# where an uninterrupted one does; a rank that stalls makes the others fail at their next
# collective with --collective-timeout, naming the collective, the step and the missing rank;
# ranks whose set-ups differ fail in preflight instead of hanging.
# Usage: faults.sh path/to/mnist_mlp path/to/mpirun
set -u
bin=$1 mpirun=$2
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 300 40 # batches of 16: 19 steps per epoch

flags=(--data "$tmp/data" --hidden 32 --epochs 2 --batch-size 16 --threads 1 --momentum 0.9)
launch() { "$mpirun" -np 2 --oversubscribe "$@"; }

launch "$bin" "${flags[@]}" --save "$tmp/A.safetensors" >"$tmp/A.out" 2>&1 ||
  { fail "uninterrupted run"; cat "$tmp/A.out"; }

# A rank killed after step 25 (in epoch 2), checkpoints every 4 steps.
start=$(date +%s)
launch -x MINIDL_TEST_KILL_RANK=1 -x MINIDL_TEST_KILL_AFTER_STEP=25 "$bin" "${flags[@]}" \
  --checkpoint-dir "$tmp/ck" --checkpoint-every-steps 4 --save "$tmp/killed.safetensors" \
  >"$tmp/killed.out" 2>&1
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] || fail "kill: the job with a dead rank exited 0"
[ "$took" -le 30 ] || fail "kill: the job took ${took} s to end"
[ ! -e "$tmp/killed.safetensors" ] || fail "kill: the broken job saved parameters"
newest=$(cd "$tmp/ck" && ls | tail -1)
[ "$newest" = ckpt-e0001-s000005.safetensors ] || fail "kill: newest checkpoint is '$newest'"
if launch "$bin" "${flags[@]}" --resume "$tmp/ck" --save "$tmp/resumed.safetensors" \
  >"$tmp/resumed.out" 2>&1 && cmp -s "$tmp/A.safetensors" "$tmp/resumed.safetensors"; then
  echo "ok   kill: job ended in ${took} s (exit $rc); resumed from $newest: bitwise the uninterrupted run"
else
  fail "kill: resume: $(cat "$tmp/resumed.out")"
fi

# A rank that stalls after step 6: the other one gives up at its next collective.
start=$(date +%s)
launch -x MINIDL_TEST_STALL_RANK=1 -x MINIDL_TEST_STALL_AFTER_STEP=6 "$bin" "${flags[@]}" \
  --collective-timeout 2 >"$tmp/stall.out" 2>&1
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] || fail "stall: the job exited 0"
[ "$took" -le 30 ] || fail "stall: the job took ${took} s to end"
want="error on rank 0: training step 7 (epoch 1, step 7 of the epoch): allreduce 'bucket0.allreduce'"
want2="did not complete within the collective timeout of 2 s: rank(s) 0 arrived, rank(s) 1 did not (rank 1 last entered #"
if grep -qF "$want" "$tmp/stall.out" && grep -qF "$want2" "$tmp/stall.out"; then
  echo "ok   stall: ended in ${took} s: $(grep -o 'error on rank 0.*' "$tmp/stall.out")"
else
  fail "stall: unclear error: $(cat "$tmp/stall.out")"
fi

# Ranks started with different seeds: preflight names the difference, nothing hangs.
start=$(date +%s)
"$mpirun" --oversubscribe -np 1 "$bin" "${flags[@]}" --seed 1 : -np 1 "$bin" "${flags[@]}" \
  --seed 2 >"$tmp/pre.out" 2>&1
rc=$?
took=$(($(date +%s) - start))
[ "$rc" -ne 0 ] && [ "$took" -le 30 ] &&
  grep -qF "preflight: the training set-up of rank(s) 1 differs from rank 0's" "$tmp/pre.out" &&
  echo "ok   preflight: ended in ${took} s: $(grep -o 'preflight.*' "$tmp/pre.out" | head -1)" ||
  fail "preflight (exit $rc after ${took} s): $(cat "$tmp/pre.out")"
exit $((fails > 0))
