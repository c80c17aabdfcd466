#!/usr/bin/env bash
# The simulated program is the real one: the MLP built against SimGrid's SMPI, run by smpirun on
# 16 simulated ranks (16 nodes x 1 rank, and 4 nodes x 4 ranks with --reduce hierarchical, whose
# node level then runs in an MPI_Win_allocate_shared window of SMPI's) with --deterministic,
# saves parameter bytes identical to one real process. And the simulated build refuses what a
# simulated rank cannot do (--threads 2, --overlap, --collective-timeout), in one line naming
# the flag. Builds the simulated MLP first (incrementally) in SIM_BUILD_DIR.
# Usage: simgrid_deterministic.sh path/to/mnist_mlp SOURCE_DIR SIM_BUILD_DIR [CCACHE]
set -u
# shellcheck source=simgrid_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/simgrid_common.sh"

synthetic_idx "$tmp/data" 384 64 # 3 steps of 128: 16 micro-shards of 8, one per rank
flags=(--data "$tmp/data" --deterministic --batch-size 128 --micro-batch 8 --epochs 1 --threads 1
  --hidden 32 --quiet)

# simulate NODES RANKS_PER_NODE OUT FLAGS...: smpirun on the first NODES hosts of the platform.
simulate() {
  local nodes=$1 rpn=$2 out=$3
  shift 3
  local hosts=$tmp/hosts-$nodes-$rpn n r
  : >"$hosts"
  for ((n = 0; n < nodes; n++)); do
    for ((r = 0; r < rpn; r++)); do echo "node-$n" >>"$hosts"; done
  done
  OMP_NUM_THREADS=1 smpirun -np $((nodes * rpn)) -platform "$platform" -hostfile "$hosts" \
    --cfg=smpi/host-speed:1Gf --cfg=smpi/coll-selector:ompi --log=root.thresh:warning \
    "$simmlp" "$@" >"$out" 2>&1
}

OMP_NUM_THREADS=1 "$mlp" "${flags[@]}" --save "$tmp/real.safetensors" >"$tmp/real.out" 2>&1 ||
  { cat "$tmp/real.out"; fail "the real one-process run failed"; }

for layout in 16x1:allreduce 4x4:hierarchical; do
  shape=${layout%:*} reduce=${layout#*:}
  out=$tmp/sim-$shape.out
  if ! simulate "${shape%x*}" "${shape#*x}" "$out" "${flags[@]}" --reduce "$reduce" \
    --save "$tmp/sim-$shape.safetensors"; then
    tail -20 "$out"
    fail "simulated $shape ($reduce) failed"
    continue
  fi
  if cmp -s "$tmp/real.safetensors" "$tmp/sim-$shape.safetensors"; then
    echo "ok   simulated ${shape%x*} nodes x ${shape#*x} ranks (--reduce $reduce): bitwise identical to one real process"
  else
    fail "simulated $shape ($reduce): the parameters differ from one real process"
  fi
done

# Refused in one line naming the flag, with a non-zero exit.
refused() {
  local what=$1 expect=$2
  shift 2
  if simulate 2 1 "$tmp/refused.out" --data "$tmp/data" --batch-size 128 --epochs 1 --quiet "$@"; then
    fail "$what: the simulated run was not refused"
  elif ! grep -q -- "$expect" "$tmp/refused.out"; then
    fail "$what: the error does not say '$expect':"
    cat "$tmp/refused.out"
  else
    echo "ok   $what refused: $(grep -m1 -- "$expect" "$tmp/refused.out")"
  fi
}
refused "--threads 2" "could not start: --threads 2: a simulated run" --threads 2
refused "--overlap" "could not start: --overlap does not apply to a simulated run" --overlap
refused "--collective-timeout 5" \
  "could not start: --collective-timeout does not apply to a simulated run" \
  --collective-timeout 5

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all simulated runs match"
