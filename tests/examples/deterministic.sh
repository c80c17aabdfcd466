#!/usr/bin/env bash
# Deterministic mode: K training steps of the MLP (SGD with momentum, and AdamW with clipping and
# a cosine schedule, also accumulated over micro-steps) and of the MNIST CNN give
# bitwise-identical
# parameter files under 1x1, 1x2, 2x1, 2x2 and 4x1 ranks x threads (4x1 and 2x2 oversubscribe
# a small machine), and a checkpoint written at step K/2 on 4 ranks, resumed on 2, ends bitwise
# identical to the uninterrupted 1x1 run. The training sets leave ragged last batches, so the
# ranks own subtrees of different sizes there.
# Usage: deterministic.sh path/to/mnist_mlp path/to/mnist_cnn path/to/mpirun
set -u
mlp=$1 cnn=$2 mpirun=$3
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/mlp-data" 300 40 # batches of 64: 4 full, then 44 (6 micro-shards of 8)
synthetic_idx "$tmp/cnn-data" 304 40 # batches of 32: 9 full, then 16 (4 micro-shards of 4)

# launch RANKS THREADS BIN FLAGS...: one process for 1 rank, else mpirun (idle threads sleep:
# the layouts oversubscribe the cores).
launch() {
  local ranks=$1 threads=$2 bin=$3
  shift 3
  on_layout "$ranks" "$threads" "$bin" --threads "$threads" "$@"
}

# check NAME BIN FLAGS...: the five layouts against 1x1.
check() {
  local name=$1 bin=$2
  shift 2
  for layout in 1x1 1x2 2x1 2x2 4x1; do
    if ! launch "${layout%x*}" "${layout#*x}" "$bin" "$@" --save "$tmp/$name-$layout.safetensors" \
      >"$tmp/$name-$layout.out" 2>&1; then
      fail "$name $layout: the run failed:"
      cat "$tmp/$name-$layout.out"
      continue
    fi
    # The epoch lines without their timings: loss and accuracies as printed.
    grep -o "^epoch.*test acc *[0-9.]*%" "$tmp/$name-$layout.out" >"$tmp/$name-$layout.stats"
    [ "$layout" = 1x1 ] && continue
    if cmp -s "$tmp/$name-1x1.safetensors" "$tmp/$name-$layout.safetensors"; then
      echo "ok   $name $layout: bitwise identical to 1x1"
    else
      fail "$name $layout: parameters differ from 1x1"
    fi
    if [ ! -s "$tmp/$name-$layout.stats" ] ||
      ! cmp -s "$tmp/$name-1x1.stats" "$tmp/$name-$layout.stats"; then
      fail "$name $layout: epoch statistics differ from 1x1:"
      diff "$tmp/$name-1x1.stats" "$tmp/$name-$layout.stats"
    fi
  done
}

mlp_flags=(--data "$tmp/mlp-data" --hidden 32,16 --epochs 2 --momentum 0.9 --lr 0.05 --seed 3
  --deterministic)
cnn_flags=(--data "$tmp/cnn-data" --epochs 1 --lr 0.05 --seed 3 --deterministic --micro-batch 4)
# The general step: AdamW, global-norm clipping (the norm summed after the tree reduction) and a
# cosine schedule with warm-up give the same bits on every layout too.
adamw_flags=(--data "$tmp/mlp-data" --hidden 32,16 --epochs 2 --optimizer adamw --lr 0.01
  --weight-decay 0.01 --lr-schedule cosine --warmup-steps 3 --clip-grad-norm 0.5 --seed 3
  --deterministic)
check mlp "$mlp" "${mlp_flags[@]}"
check adamw "$mlp" "${adamw_flags[@]}"
check cnn "$cnn" "${cnn_flags[@]}"

# Gradient accumulation: --batch-size 16 --accumulate 4 trains adamw's batches of 64 in
# micro-steps of 16 (each a subtree of the batch's tree, summed in its order): the same bits as
# adamw's 1x1 on every layout whose ranks each get a micro-shard of every micro-step.
for layout in 1x1 1x2 2x1 2x2; do
  name=accumulate-$layout
  if ! launch "${layout%x*}" "${layout#*x}" "$mlp" "${adamw_flags[@]}" --batch-size 16 \
    --accumulate 4 --save "$tmp/$name.safetensors" >"$tmp/$name.out" 2>&1; then
    fail "$name: the run failed: $(cat "$tmp/$name.out")"
  elif cmp -s "$tmp/adamw-1x1.safetensors" "$tmp/$name.safetensors"; then
    echo "ok   --batch-size 16 --accumulate 4 on $layout: bitwise identical to --batch-size 64"
  else
    fail "--batch-size 16 --accumulate 4 on $layout: parameters differ from --batch-size 64"
  fi
done

# --reduce hierarchical: the ranks of a node join their parts of the tree in shared memory, then
# the nodes' parts are joined: the same bits. One node of 2 ranks, and nodes pretended with
# MINIDL_RANKS_PER_NODE: 2 nodes of 2, nodes of 2 and 1, 4 nodes of 1; accumulated micro-steps
# (the tree joined outside the graph) on one node of 2 and on 2 nodes of 1.
for case in "2 0 mlp" "4 2 mlp" "3 2 mlp" "4 1 mlp" "2 0 accumulate" "2 1 accumulate"; do
  read -r ranks rpn what <<<"$case"
  name=hierarchical-${ranks}x1-rpn$rpn-$what
  ref=mlp flags=("${mlp_flags[@]}")
  if [ "$what" = accumulate ]; then
    ref=adamw flags=("${adamw_flags[@]}" --batch-size 16 --accumulate 4)
  fi
  per_node=""
  [ "$rpn" -eq 0 ] || per_node=$rpn
  if ! MINIDL_RANKS_PER_NODE=$per_node launch "$ranks" 1 "$mlp" "${flags[@]}" \
    --reduce hierarchical --save "$tmp/$name.safetensors" >"$tmp/$name.out" 2>&1; then
    fail "$name: the run failed: $(cat "$tmp/$name.out")"
  elif cmp -s "$tmp/$ref-1x1.safetensors" "$tmp/$name.safetensors"; then
    echo "ok   $what --reduce hierarchical on $ranks ranks, ${per_node:-all} per node: bitwise" \
      "identical to 1x1"
  else
    fail "$name: parameters differ from 1x1"
  fi
done

# For contrast (not a check): without --deterministic, 2 ranks usually end with other bits.
launch 2 1 "$mlp" "${mlp_flags[@]/--deterministic/--no-fuse}" --save "$tmp/plain-2x1.safetensors" \
  >/dev/null 2>&1
launch 1 1 "$mlp" "${mlp_flags[@]/--deterministic/--no-fuse}" --save "$tmp/plain-1x1.safetensors" \
  >/dev/null 2>&1
if cmp -s "$tmp/plain-1x1.safetensors" "$tmp/plain-2x1.safetensors"; then
  echo "note without --deterministic, 1x1 and 2x1 happened to agree too"
else
  echo "note without --deterministic, 1x1 and 2x1 differ (as expected)"
fi

# resume NAME BIN STEP FLAGS...: on 4 ranks, checkpoint at STEP and die right after it; resume
# on 2 ranks; the result must be 1x1's.
resume() {
  local name=$1 bin=$2 step=$3
  shift 3
  MINIDL_TEST_KILL_AFTER_STEP=$step launch 4 1 "$bin" "$@" --checkpoint-dir "$tmp/$name-ck" \
    --checkpoint-every-steps "$step" --save "$tmp/$name-killed.safetensors" \
    >"$tmp/$name-killed.out" 2>&1 && fail "$name: the run meant to die after step $step exited 0"
  [ ! -e "$tmp/$name-killed.safetensors" ] || fail "$name: the killed run saved its parameters"
  if ! launch 2 1 "$bin" "$@" --resume "$tmp/$name-ck" --save "$tmp/$name-resumed.safetensors" \
    >"$tmp/$name-resumed.out" 2>&1; then
    fail "$name: the resume on 2 ranks failed:"
    cat "$tmp/$name-resumed.out"
  elif ! grep -q "resumed from .*(training step $step)" "$tmp/$name-resumed.out"; then
    fail "$name: did not resume from the checkpoint of step $step: $(cat "$tmp/$name-resumed.out")"
  elif cmp -s "$tmp/$name-1x1.safetensors" "$tmp/$name-resumed.safetensors"; then
    echo "ok   $name: checkpointed at step $step on 4 ranks, resumed on 2: bitwise identical to 1x1"
  else
    fail "$name: checkpointed on 4 ranks and resumed on 2, parameters differ from 1x1"
  fi
}
resume mlp "$mlp" 5 "${mlp_flags[@]}"  # K = 10 steps (2 epochs of 5), at the epoch boundary
resume cnn "$cnn" 5 "${cnn_flags[@]}"  # K = 10 steps (1 epoch), mid-epoch
resume adamw "$mlp" 7 "${adamw_flags[@]}"  # mid-epoch: AdamW moments and the schedule resume

# Bad uses end in one line naming the problem.
expect() {
  local want=$1
  shift
  if "$mlp" --data "$tmp/mlp-data" --epochs 1 --threads 1 "$@" >/dev/null 2>"$tmp/err"; then
    fail "accepted: $*"
  elif [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
    fail "$*: wanted one line with '$want', got: $(cat "$tmp/err")"
  fi
}
expect "the micro-batch 5 does not divide the batch size 64" --deterministic --micro-batch 5
expect "--micro-batch requires --deterministic" --micro-batch 4
expect "--deterministic excludes --overlap" --deterministic --overlap
expect "--reduce root does not apply with --deterministic (allowed there: allreduce, hierarchical)" \
  --deterministic --reduce root
[ "$fails" -eq 0 ] && echo "ok   bad uses: one clear line each"
exit $((fails > 0))
