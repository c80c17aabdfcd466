#!/usr/bin/env bash
# Signals: SIGTERM or SIGINT to mpirun, to one rank, or to a single process ends the run (the
# test's TIMEOUT bounds "promptly") with a non-zero exit, leaves no half-written checkpoint (no
# temporary file, every checkpoint loads), and the newest checkpoint resumes. A SIGTERM that
# arrives while rank 0 writes a checkpoint (MINIDL_TEST_SIGTERM_WHILE_CHECKPOINTING_STEP) ends
# the job right after that checkpoint is complete: it is the newest, and resumes.
# Usage: signals.sh path/to/mnist_mlp path/to/mpirun
set -u
bin=$1 mpirun=$2
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 200 20

flags=(--data "$tmp/data" --hidden 32 --batch-size 8 --threads 1 --quiet --checkpoint-every-steps 1)
mp=("$mpirun" --oversubscribe --bind-to none -x OMP_WAIT_POLICY=passive)

# check_dir NAME DIR: no temporary file, and a run resumes from the newest checkpoint.
check_dir() {
  local name=$1 dir=$2
  local leftovers
  leftovers=$(find "$dir" -name '*.tmp*' | wc -l)
  local newest
  newest=$(cd "$dir" && ls ckpt-*.safetensors 2>/dev/null | tail -1)
  if [ "$leftovers" -ne 0 ] || [ -z "$newest" ]; then
    fail "$name: $leftovers temporary file(s), newest checkpoint '$newest': $(ls "$dir")"
    return
  fi
  "$bin" "${flags[@]}" --epochs 1000 --max-steps 1 --resume "$dir" \
    --checkpoint-dir "$tmp/$name.after" >"$tmp/$name.resume.out" 2>&1
  if grep -q "test loss" "$tmp/$name.resume.out"; then
    echo "ok   $name: no temporary file, resumed from $newest: $(tail -1 "$tmp/$name.resume.out")"
  else
    fail "$name: resume from $newest: $(cat "$tmp/$name.resume.out")"
  fi
}

# run_and_signal NAME SIGNAL TARGET CMD...: starts CMD in the background, waits for its third
# checkpoint, sends SIGNAL to TARGET (mpirun: the launcher; rank: one of its ranks; self: the
# process), and expects a non-zero exit.
run_and_signal() {
  local name=$1 sig=$2 target=$3
  shift 3
  "$@" --checkpoint-dir "$tmp/$name" >"$tmp/$name.out" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    [ "$(find "$tmp/$name" -name 'ckpt-*.safetensors' 2>/dev/null | wc -l)" -ge 3 ] && break
    sleep 0.1
  done
  local victim=$pid
  if [ "$target" = rank ]; then
    victim=$(pgrep -P "$pid" -f mnist_mlp | tail -1)
  fi
  kill -s "$sig" "$victim"
  wait "$pid"
  local rc=$?
  if [ "$rc" -eq 0 ]; then
    fail "$name: exit 0 after $sig to $target: $(cat "$tmp/$name.out")"
  else
    echo "ok   $name: $sig to $target: exit $rc"
    check_dir "$name" "$tmp/$name"
  fi
}

run_and_signal serial_term TERM self "$bin" "${flags[@]}" --epochs 1000
run_and_signal serial_int INT self "$bin" "${flags[@]}" --epochs 1000
run_and_signal mpirun_term TERM mpirun "${mp[@]}" -np 2 "$bin" "${flags[@]}" --epochs 1000
run_and_signal mpirun_int INT mpirun "${mp[@]}" -np 2 "$bin" "${flags[@]}" --epochs 1000
run_and_signal rank_term TERM rank "${mp[@]}" -np 2 "$bin" "${flags[@]}" --epochs 1000

# SIGTERM while the checkpoint of step 5 is written: that checkpoint is finished, then the job
# ends.
"${mp[@]}" -np 2 -x MINIDL_TEST_SIGTERM_WHILE_CHECKPOINTING_STEP=5 "$bin" "${flags[@]}" \
  --epochs 1000 --checkpoint-dir "$tmp/during" >"$tmp/during.out" 2>&1
rc=$?
newest=$(cd "$tmp/during" && ls | tail -1)
if [ "$rc" -ne 0 ] && [ "$newest" = ckpt-e0000-s000005.safetensors ]; then
  echo "ok   SIGTERM while writing the checkpoint of step 5: exit $rc, newest $newest"
  check_dir during "$tmp/during"
else
  fail "SIGTERM while writing: exit $rc, newest '$newest': $(cat "$tmp/during.out")"
fi
exit $((fails > 0))
