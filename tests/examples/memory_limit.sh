#!/usr/bin/env bash
# A container's memory limit: with a fake cgroup tree (MINIDL_CGROUP_ROOT) allowing 200 MiB, a
# model whose 256 MiB weight would be OOM-killed is refused before anything is allocated, with
# the size it needs; on 2 ranks of one host a 128 MiB weight (256 MiB for the two) is refused
# too, naming the ranks; a model that fits trains.
# Usage: memory_limit.sh path/to/mnist_mlp path/to/mpirun
set -u
bin=$1 mpirun=$2
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 40 10

# The limit, for cgroup v2 (at the root) and v1 (the memory controller's root).
cg="$tmp/cgroup"
mkdir -p "$cg/memory"
echo $((200 << 20)) >"$cg/memory.max"
echo 0 >"$cg/memory.current"
echo $((200 << 20)) >"$cg/memory/memory.limit_in_bytes"
echo 0 >"$cg/memory/memory.usage_in_bytes"
flags=(--data "$tmp/data" --epochs 1 --batch-size 8 --threads 1 --quiet)

check() { # check NAME WANT-RC TEXT CMD...
  local name=$1 want=$2 text=$3
  shift 3
  "$@" >"$tmp/$name.out" 2>&1
  local rc=$?
  if [ "$rc" -eq "$want" ] && [ "$(grep -cF -- "$text" "$tmp/$name.out")" -eq 1 ]; then
    echo "ok   $name: $(grep -F -- "$text" "$tmp/$name.out")"
  else
    fail "$name: exit $rc (expected $want), '$text' not printed once: $(cat "$tmp/$name.out")"
  fi
}

check one_rank 1 "mnist_mlp: error: a tensor of shape [8192,8192] f32 needs 256.0 MiB, more than the 200.0 MiB of memory available (the memory cgroup's limit less its usage)" \
  env MINIDL_CGROUP_ROOT="$cg" "$bin" "${flags[@]}" --hidden 8192,8192
check two_ranks 1 "needs 128.0 MiB per rank, 256.0 MiB for the 2 ranks on this host, more than the 200.0 MiB of memory available (the memory cgroup's limit less its usage)" \
  "$mpirun" -np 2 --oversubscribe --bind-to none -x OMP_WAIT_POLICY=passive \
  -x MINIDL_CGROUP_ROOT="$cg" "$bin" "${flags[@]}" --hidden 4096,8192
check fits 0 "mnist_mlp: 1 epoch(s)  test loss" \
  env MINIDL_CGROUP_ROOT="$cg" "$bin" "${flags[@]}" --hidden 32
exit $((fails > 0))
