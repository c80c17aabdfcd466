#!/usr/bin/env bash
# A stall without --collective-timeout: on 2 ranks, rank 1 sleeps 4 s after step 3
# (MINIDL_TEST_STALL_*); with the stall period lowered to 1 s (MINIDL_STALL_WARNING_SECONDS,
# 60 by default) rank 0 warns, naming the collective and the rank that did not arrive, keeps
# waiting, and the job ends normally with the parameters of a run without the stall. A bad
# MINIDL_STALL_WARNING_SECONDS is refused.
# Usage: stall_warning.sh path/to/mnist_mlp path/to/mpirun
set -u
bin=$1 mpirun=$2
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 120 20

flags=(--data "$tmp/data" --hidden 16 --epochs 1 --batch-size 16 --threads 1 --quiet)
mp=("$mpirun" -np 2 --oversubscribe --bind-to none -x OMP_WAIT_POLICY=passive)

"${mp[@]}" "$bin" "${flags[@]}" --save "$tmp/A.safetensors" >"$tmp/A.out" 2>&1 ||
  fail "run without a stall: $(cat "$tmp/A.out")"

"${mp[@]}" -x MINIDL_STALL_WARNING_SECONDS=1 -x MINIDL_TEST_STALL_RANK=1 \
  -x MINIDL_TEST_STALL_AFTER_STEP=3 -x MINIDL_TEST_STALL_SECONDS=4 "$bin" "${flags[@]}" \
  --save "$tmp/B.safetensors" >"$tmp/B.out" 2>&1
rc=$?
want="warning on rank 0: allreduce #"
want2="s: rank(s) 1 did not arrive (rank 1 last entered #"
if [ "$rc" -eq 0 ] && grep -F "$want" "$tmp/B.out" | grep -qF "$want2" &&
  grep -qF "still waiting (no --collective-timeout)" "$tmp/B.out" &&
  ! grep -q "warning on rank 1" "$tmp/B.out" &&
  cmp -s "$tmp/A.safetensors" "$tmp/B.safetensors"; then
  echo "ok   stall: $(grep -c "$want" "$tmp/B.out") warning(s), first: $(grep -m1 -F "$want" "$tmp/B.out"); the parameters equal the run without the stall"
else
  fail "stall (exit $rc): $(cat "$tmp/B.out")"
fi

"${mp[@]}" -x MINIDL_STALL_WARNING_SECONDS=soon "$bin" "${flags[@]}" >"$tmp/C.out" 2>&1
rc=$?
want="mnist_mlp: error: rank(s) 0, 1 of 2 could not start: MINIDL_STALL_WARNING_SECONDS must be a number of seconds >= 0 (0: no warning), got 'soon'"
if [ "$rc" -eq 1 ] && [ "$(grep -cF "$want" "$tmp/C.out")" -eq 1 ]; then
  echo "ok   bad MINIDL_STALL_WARNING_SECONDS: $want"
else
  fail "bad MINIDL_STALL_WARNING_SECONDS (exit $rc): $(cat "$tmp/C.out")"
fi
exit $((fails > 0))
