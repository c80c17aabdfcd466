#!/usr/bin/env bash
# ctest scripts.netns_cluster: the MLP on real hosts made by scripts/netns-cluster (network
# namespaces on this machine, TCP between hosts, shared memory inside one). With --deterministic
# --reduce hierarchical, 2 hosts x 1 rank and 2 hosts x 2 ranks save the bytes of the
# one-process run; a host killed mid-run (every process in its namespace) ends the job with a
# non-zero exit and nothing saved; the script stopped by SIGTERM ends the job and removes its
# hosts; a stalled rank makes --collective-timeout name its host. With
# the multi-rank test binary, its hierarchical and tree tests run on 2 hosts x 2 ranks too (the
# non-deterministic strategy against the serial run, the collectives against their formulas). No
# namespace, veth or bridge of a run is left behind.
# Exits 77 (ctest: skipped) when this machine does not allow network namespaces.
# usage: netns_cluster.sh path/to/mnist_mlp [path/to/minidl_mpi_tests]
set -u
[ $# -ge 1 ] && [ $# -le 2 ] ||
  { echo "usage: $0 path/to/mnist_mlp [path/to/minidl_mpi_tests]" >&2; exit 2; }
mlp=$1 mpi_tests=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
cluster=$root/scripts/netns-cluster

if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: network namespaces need root" >&2
  exit 77
fi
probe=mdlprobe$$
if ! ip netns add "$probe" 2>/dev/null; then
  echo "skipped: 'ip netns add' is not allowed here" >&2
  exit 77
fi
ip netns del "$probe"
if ! unshare --uts true 2>/dev/null; then
  echo "skipped: 'unshare --uts' (a host name per namespace) is not allowed here" >&2
  exit 77
fi

# shellcheck source=../examples/common.sh
source "$root/tests/examples/common.sh"
synthetic_idx "$tmp/data" 300 40 # batches of 64: 4 full, then 44 (6 micro-shards of 8)
# Runs of this test leave nothing behind: compared with what exists before.
made() { { ip netns list; ip -o link show; } | grep -o "mdl[0-9]*[a-z]*[0-9]*" | sort -u; }
before=$(made)

flags=(--data "$tmp/data" --hidden 32,16 --momentum 0.9 --lr 0.05 --seed 3 --deterministic
  --threads 1)
OMP_NUM_THREADS=1 "$mlp" "${flags[@]}" --epochs 2 --save "$tmp/serial.safetensors" >"$tmp/serial.out" 2>&1 ||
  { fail "the one-process run failed: $(cat "$tmp/serial.out")"; exit 1; }

for layout in 2x1 2x2; do
  out=$tmp/$layout
  if ! OMP_NUM_THREADS=1 "$cluster" --hosts "${layout%x*}" --ranks-per-host "${layout#*x}" -- \
    "$mlp" "${flags[@]}" --epochs 2 --reduce hierarchical --save "$out.safetensors" \
    >"$out.out" 2>&1; then
    fail "$layout hosts x ranks: the run failed: $(cat "$out.out")"
  elif ! grep -q "2 host(s) x ${layout#*x} rank(s)" "$out.out"; then
    fail "$layout: the cluster was not the one asked for: $(cat "$out.out")"
  elif cmp -s "$tmp/serial.safetensors" "$out.safetensors"; then
    echo "ok   2 hosts x ${layout#*x} rank(s), --deterministic --reduce hierarchical: bitwise" \
      "identical to one process"
  else
    fail "$layout: parameters differ from the one-process run"
  fi
done

if [ -n "$mpi_tests" ]; then
  if OMP_NUM_THREADS=1 "$cluster" --hosts 2 --ranks-per-host 2 -- "$mpi_tests" \
    --gtest_filter='Hierarchical.*:MpiCollectives.TreeAllreduce*:MpiCollectives.Hierarchical*' \
    >"$tmp/gtest.out" 2>&1; then
    echo "ok   2 hosts x 2 ranks: $(grep -c '^.*\[       OK \]' "$tmp/gtest.out") multi-rank test" \
      "runs passed (Hierarchical.*, the tree and hierarchical collectives)"
  else
    fail "2 hosts x 2 ranks: the multi-rank tests failed: $(cat "$tmp/gtest.out")"
  fi
fi

# A host dies: every process in its namespace is killed once training runs.
OMP_NUM_THREADS=1 "$cluster" --hosts 2 --ranks-per-host 2 --info "$tmp/hosts" -- \
  "$mlp" "${flags[@]}" --epochs 1000 --reduce hierarchical --save "$tmp/killed.safetensors" \
  >"$tmp/killed.out" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  grep -q "^epoch" "$tmp/killed.out" 2>/dev/null && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
victim=$(awk '$1 == "host" { ns = $3 } END { print ns }' "$tmp/hosts" 2>/dev/null)
if [ -z "$victim" ] || ! kill -0 "$job" 2>/dev/null; then
  fail "kill: the job did not get to run: $(cat "$tmp/killed.out")"
  wait "$job"
else
  start=$(date +%s)
  mapfile -t pids < <(ip netns pids "$victim")
  kill -KILL "${pids[@]}"
  wait "$job"
  rc=$?
  took=$(($(date +%s) - start))
  if [ "$rc" -eq 0 ]; then
    fail "kill: the job exited 0 after host $victim was killed"
  elif [ -e "$tmp/killed.safetensors" ]; then
    fail "kill: the broken job saved parameters"
  else
    echo "ok   kill: host $victim killed (${#pids[@]} processes), the job ended in ${took} s (exit $rc)"
  fi
fi

# The script itself is stopped (SIGTERM, as by a batch system or kill) while training runs: it
# ends the job and removes its hosts.
OMP_NUM_THREADS=1 "$cluster" --hosts 2 --ranks-per-host 1 --info "$tmp/hosts3" -- \
  "$mlp" "${flags[@]}" --epochs 1000 >"$tmp/term.out" 2>&1 &
job=$!
for _ in $(seq 1 600); do
  grep -q "^epoch" "$tmp/term.out" 2>/dev/null && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if ! kill -TERM "$job" 2>/dev/null; then
  fail "stop: the job did not get to run: $(cat "$tmp/term.out")"
fi
wait "$job"
rc=$?
left=""
for ns in $(awk '$1 == "host" { print $3 }' "$tmp/hosts3" 2>/dev/null); do
  ! ip netns list | grep -qw "$ns" || left+=" $ns"
done
if [ "$rc" -ne 143 ]; then
  fail "stop: the script exited $rc after SIGTERM, not 143: $(cat "$tmp/term.out")"
elif [ -n "$left" ] || [ ! -s "$tmp/hosts3" ]; then
  fail "stop: hosts left behind after SIGTERM:${left:- (no host list)}"
else
  echo "ok   stop: SIGTERM to the script ended the job (exit $rc) and removed its hosts"
fi

# A rank stalls (rank 1, on the second host): rank 0, waiting for it among the node leaders,
# names it and its host.
OMP_NUM_THREADS=1 "$cluster" --hosts 2 --ranks-per-host 1 --info "$tmp/hosts2" \
  -x MINIDL_TEST_STALL_RANK=1 -x MINIDL_TEST_STALL_AFTER_STEP=3 -- \
  "$mlp" "${flags[@]}" --epochs 2 --reduce hierarchical --collective-timeout 3 \
  >"$tmp/stall.out" 2>&1
rc=$?
host1=$(awk '$1 == "host" { ns = $3 } END { print ns }' "$tmp/hosts2" 2>/dev/null)
if [ "$rc" -eq 0 ]; then
  fail "stall: the job exited 0"
elif [ -n "$host1" ] && grep -q "error on rank 0: training step 4 .*did not complete within the collective timeout of 3 s: rank(s) 0 arrived, rank(s) 1 did not (rank 1 last entered #[0-9]* on host $host1)" \
  "$tmp/stall.out"; then
  echo "ok   stall: $(grep -o 'error on rank.*' "$tmp/stall.out" | head -1)"
else
  fail "stall: the error does not name host '$host1': $(cat "$tmp/stall.out")"
fi

after=$(made)
[ "$before" = "$after" ] || fail "namespaces or links were left behind: $(diff <(echo "$before") <(echo "$after"))"
exit $((fails > 0))
