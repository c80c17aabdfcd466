#!/usr/bin/env bash
# Degenerate sizes: more ranks than training samples, a last batch that cannot feed every rank
# in deterministic mode, or more micro-shards per rank than a rank's graph may hold are refused
# before training, once, naming the flags to change; a batch larger than the data, more thread
# replicas than samples, and a test set smaller than the rank count train and end with a
# finite loss. No run prints a NaN loss with exit 0.
# Usage: degenerate_sizes.sh path/to/mnist_mlp path/to/mpirun
set -u
bin=$1 mpirun=$2
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 120 20

flags=(--data "$tmp/data" --hidden 16 --epochs 1 --quiet) # one thread: OMP_NUM_THREADS=1
on() { # on RANKS CMD...
  local ranks=$1
  shift
  if [ "$ranks" -eq 1 ]; then
    "$@"
  else
    "$mpirun" -np "$ranks" --oversubscribe --bind-to none -x OMP_WAIT_POLICY=passive "$@"
  fi
}

# refused NAME RANKS TEXT FLAGS...: exit 1, TEXT printed once.
refused() {
  local name=$1 ranks=$2 text=$3
  shift 3
  on "$ranks" "$bin" "${flags[@]}" "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  local n
  n=$(grep -cF -- "$text" "$tmp/$name.out")
  if [ "$rc" -eq 1 ] && [ "$n" -eq 1 ]; then
    echo "ok   $name: $(grep -F -- "$text" "$tmp/$name.out")"
  else
    fail "$name: exit $rc, '$text' printed $n time(s): $(cat "$tmp/$name.out")"
  fi
}

# works NAME RANKS FLAGS...: exit 0 and a finite test loss.
works() {
  local name=$1 ranks=$2
  shift 2
  on "$ranks" "$bin" "${flags[@]}" "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  if [ "$rc" -eq 0 ] && grep -q "test loss [0-9]" "$tmp/$name.out" &&
    ! grep -qi "nan\|inf" "$tmp/$name.out"; then
    echo "ok   $name: $(tail -1 "$tmp/$name.out")"
  else
    fail "$name: exit $rc: $(cat "$tmp/$name.out")"
  fi
}

refused more_ranks_than_samples 3 \
  "rank(s) 0, 1, 2 of 3 could not start: 2 training sample(s) cannot give each of the 3 ranks a sample: no training step would run; use more samples (--train-limit) or fewer ranks (mpirun -np)" \
  --train-limit 2
refused deterministic_last_batch 2 \
  "could not start: deterministic mode: the last batch (--train-limit, --batch-size) of 8 samples holds 1 micro-shard(s) of 8, fewer than the 2 ranks: use a smaller --micro-batch or fewer ranks" \
  --deterministic --batch-size 16 --micro-batch 8
refused too_many_micro_shards 1 \
  "micro-shard(s) per rank, more than the 1024 a rank's graph may hold" \
  --deterministic --batch-size 4096 --micro-batch 1 --train-limit 0

works batch_larger_than_data 1 --batch-size 1000
works batch_larger_than_data.np2 2 --batch-size 1000
works accumulate_past_the_data 1 --batch-size 64 --accumulate 4
works deterministic_batch_larger_than_data 2 --deterministic --batch-size 1024 --micro-batch 8
works replicas_more_than_samples 1 --thread-mode replicas --threads 32 --batch-size 8
works test_set_smaller_than_ranks 3 --test-limit 2 --batch-size 16
works train_samples_equal_ranks 3 --train-limit 3 --batch-size 16
exit $((fails > 0))
