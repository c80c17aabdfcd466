#!/usr/bin/env bash
# Ranks that disagree never hang: on 2 ranks started with different command lines (mpirun's
# "A : B" form), a flag error or a missing data set on one rank only, another model, another
# build of the binary, --help on one rank, or any setting that differs, end both ranks in the
# preflight with one line from rank 0 naming the ranks and the error or first difference, and a
# non-zero exit. The test's TIMEOUT is the bound on "never a hang". Then --dump-graph on 2 ranks
# (rank 0 writes it, no collective of its own) trains and writes the graph.
# Usage: ranks_disagree.sh path/to/mnist_mlp path/to/mpirun
set -u
bin=$1 mpirun=$2
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 120 20

base=(--epochs 1 --batch-size 16 --threads 1 --quiet)
flags=(--data "$tmp/data" --hidden 16 "${base[@]}")
mp=("$mpirun" --oversubscribe --bind-to none -x OMP_WAIT_POLICY=passive)

# expect NAME RC TEXT -- A-ARGS... -- B-ARGS...: rank 0 runs A, rank 1 runs B (each a binary
# and its flags); the job must exit RC and print TEXT once, on one line.
expect() {
  local name=$1 want_rc=$2 text=$3 a=() b=()
  shift 4
  while [ "$1" != -- ]; do
    a+=("$1")
    shift
  done
  shift
  b=("$@")
  "${mp[@]}" -np 1 "${a[@]}" : -np 1 "${b[@]}" >"$tmp/$name.out" 2>&1 </dev/null
  local rc=$?
  local n
  n=$(grep -cF -- "$text" "$tmp/$name.out")
  if [ "$rc" -eq "$want_rc" ] && [ "$n" -eq 1 ]; then
    echo "ok   $name (exit $rc): $(grep -F -- "$text" "$tmp/$name.out")"
  else
    fail "$name: exit $rc (expected $want_rc), '$text' printed $n time(s): $(cat "$tmp/$name.out")"
  fi
}

# A flag error on one rank only: the other rank learns of it in the preflight.
expect flag_error_rank1 2 "mnist_mlp: error: rank(s) 1 of 2 could not start: --lr:" \
  -- "$bin" "${flags[@]}" -- "$bin" "${flags[@]}" --lr -1
expect flag_error_rank0 2 "mnist_mlp: error: rank(s) 0 of 2 could not start: The following argument was not expected: --no-such-flag" \
  -- "$bin" "${flags[@]}" --no-such-flag -- "$bin" "${flags[@]}"
# Data missing on one rank only.
expect data_missing_rank1 1 "mnist_mlp: error: rank(s) 1 of 2 could not start: " \
  -- "$bin" "${flags[@]}" -- "$bin" --data "$tmp/none" --hidden 16 "${base[@]}"
# --help on one rank only.
expect help_rank1 1 "rank 0 has 'binary mnist_mlp" \
  -- "$bin" "${flags[@]}" -- "$bin" --help
# Another model.
expect model 1 "rank 0 has '--hidden 16', rank 1 has '--hidden 24'" \
  -- "$bin" "${flags[@]}" -- "$bin" --data "$tmp/data" --hidden 24 "${base[@]}"
# Another build of the binary (the same program with one byte more).
cp "$bin" "$tmp/mnist_mlp"
printf x >>"$tmp/mnist_mlp"
expect binary 1 "first difference (rank 1) at item 1: rank 0 has 'binary mnist_mlp (" \
  -- "$bin" "${flags[@]}" -- "$tmp/mnist_mlp" "${flags[@]}"
# Settings that must agree: optimizer and its settings, schedule, epochs, loss, reduction,
# precision-shaping flags, timeouts.
common=(--data "$tmp/data" --hidden 16 --batch-size 16 --threads 1 --quiet)
while read -r flag a b; do
  epochs=(--epochs 1)
  [ "$flag" = --epochs ] && epochs=()
  expect "setting$flag" 1 "rank 0 has '$flag $a', rank 1 has '$flag $b'" \
    -- "$bin" "${common[@]}" "${epochs[@]}" "$flag" "$a" \
    -- "$bin" "${common[@]}" "${epochs[@]}" "$flag" "$b"
done <<'EOF'
--lr 0.1 0.2
--momentum 0.5 0.9
--optimizer sgd adamw
--weight-decay 0 0.001
--lr-schedule constant cosine
--warmup-steps 0 3
--epochs 1 2
--seed 1 2
--reduce allreduce root
--bucket-mb 1 2
--backend native onednn
--clip-grad-norm 0 1
--collective-timeout 0 30
EOF
for flag in --nesterov --no-shuffle --sync-bn --overlap --no-fuse; do
  expect "switch$flag" 1 "rank 0 has '$flag false', rank 1 has '$flag true'" \
    -- "$bin" "${flags[@]}" --momentum 0.9 -- "$bin" "${flags[@]}" --momentum 0.9 "$flag"
done

# --dump-graph: rank 0 alone writes it; both ranks train.
if "${mp[@]}" -np 2 "$bin" "${flags[@]}" --dump-graph "$tmp/graph.txt" >"$tmp/dump.out" 2>&1 &&
  [ -s "$tmp/graph.txt" ]; then
  echo "ok   --dump-graph on 2 ranks: $(tail -1 "$tmp/dump.out")"
else
  fail "--dump-graph on 2 ranks: $(cat "$tmp/dump.out")"
fi
exit $((fails > 0))
