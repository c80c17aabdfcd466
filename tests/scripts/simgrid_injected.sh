#!/usr/bin/env bash
# Compute injected from a table (--compute-table) in the MLP built against SimGrid's SMPI: with
# every node of the table at 1 ms per call (one point, or a line through two points around the
# node's size), one simulated rank's epoch takes its steps x nodes x 1 ms of simulated time, to
# 1 us (no kernel runs, nothing else takes time); 4 simulated ranks
# give the same simulated times in two runs (the machine's load does not enter them); a table
# that is not JSON, or a node's point that is not [ELEMENTS, SECONDS], is refused in one line
# naming the flag, and the real build refuses the flag. Builds the simulated MLP first
# (incrementally) in SIM_BUILD_DIR.
# Usage: simgrid_injected.sh path/to/mnist_mlp SOURCE_DIR SIM_BUILD_DIR [CCACHE]
set -u
# shellcheck source=simgrid_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/simgrid_common.sh"

synthetic_idx "$tmp/data" 384 64 # 3 steps of 128
flags=(--data "$tmp/data" --batch-size 128 --epochs 2 --threads 1 --hidden 32 --quiet)

# simulate RANKS OUT [injected] -- FLAGS...: smpirun on the first RANKS hosts, one rank each.
simulate() {
  local ranks=$1 out=$2 mode=$3
  shift 4
  local hosts=$tmp/hosts-$ranks n cfg=()
  : >"$hosts"
  for ((n = 0; n < ranks; n++)); do echo "node-$n" >>"$hosts"; done
  if [ "$mode" = injected ]; then
    cfg=(--cfg=smpi/simulate-computation:no --cfg=smpi/shared-malloc:global)
  fi
  OMP_NUM_THREADS=1 smpirun -np "$ranks" -platform "$platform" -hostfile "$hosts" \
    --cfg=smpi/host-speed:1Gf --cfg=smpi/coll-selector:ompi "${cfg[@]}" \
    --log=root.thresh:warning "$simmlp" "$@" >"$out" 2>&1
}

# The nodes of the training graphs of 1 and of 4 ranks (measured runs with --profile), every
# one at 1 ms per call.
for r in 1 4; do
  simulate $r "$tmp/measured-$r.out" measured -- "${flags[@]}" --profile \
    --metrics "$tmp/measured-$r.jsonl" || { tail -20 "$tmp/measured-$r.out"; fail "measured $r-rank run failed"; }
done
python3 - "$tmp" <<'EOF' || fail "could not write the table"
import json, sys
tmp = sys.argv[1]
nodes = {}
counts = {}
lines = {}
for r in (1, 4):
    recs = [json.loads(l) for l in open(f"{tmp}/measured-{r}.jsonl") if l.strip()]
    rows = next(x["kernel_times"] for x in recs if "kernel_times" in x)
    compute = [x for x in rows if x["category"] in ("compute", "update")]
    counts[r] = len(compute)
    for x in compute:
        nodes[x["node"]] = [[x["elements"], 1e-3]]
        # For the 1-rank run: a line through 0 and twice the node's size there, listed out of
        # order, interpolated at its size: 1 ms again.
        if r == 1:
            lines[x["node"]] = [[2 * x["elements"], 2e-3], [0.0, 0.0]]
json.dump({"nodes": nodes}, open(f"{tmp}/table.json", "w"))
json.dump({"nodes": lines}, open(f"{tmp}/table-lines.json", "w"))
open(f"{tmp}/nodes-1", "w").write(str(counts[1]))
EOF
nodes1=$(cat "$tmp/nodes-1")

epoch_seconds() { # the epoch times of a metrics file, one per line, as written
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "epoch" in r: print(repr(r["epoch_seconds"]))' "$1"
}

# One rank: 3 steps per epoch, every node 1 ms (one point, or interpolated between two).
for table in table table-lines; do
  if simulate 1 "$tmp/inj-1.out" injected -- "${flags[@]}" --compute-table "$tmp/$table.json" \
    --metrics "$tmp/inj-1.jsonl"; then
    expect=$(python3 -c "print(3 * $nodes1 * 1e-3)")
    while read -r t; do
      # Within 1 us: SMPI adds 10 ns of simulated time to every MPI_Wtime call (smpi/wtime).
      if python3 -c "import sys; sys.exit(not 0 <= $t - $expect < 1e-6)"; then
        echo "ok   1 rank, injected ($table): an epoch is $t s of simulated time = 3 steps x $nodes1 nodes x 1 ms"
      else
        fail "1 rank, injected ($table): an epoch took $t s of simulated time, expected $expect"
      fi
    done < <(epoch_seconds "$tmp/inj-1.jsonl")
    if grep -q "has no time for" "$tmp/inj-1.out"; then
      fail "1 rank, injected ($table): a training node is missing from the table"
      grep "has no time for" "$tmp/inj-1.out" | head -3
    fi
  else
    tail -20 "$tmp/inj-1.out"
    fail "the injected 1-rank run failed ($table)"
  fi
done

# Four ranks, twice: the same simulated times, bit for bit.
for k in a b; do
  simulate 4 "$tmp/inj-4$k.out" injected -- "${flags[@]}" --compute-table "$tmp/table.json" \
    --metrics "$tmp/inj-4$k.jsonl" || { tail -20 "$tmp/inj-4$k.out"; fail "injected 4-rank run $k failed"; }
done
if [ -s "$tmp/inj-4a.jsonl" ] && [ "$(epoch_seconds "$tmp/inj-4a.jsonl")" = "$(epoch_seconds "$tmp/inj-4b.jsonl")" ]; then
  echo "ok   4 ranks, injected, twice: the same epoch times ($(epoch_seconds "$tmp/inj-4a.jsonl" | paste -sd' '))"
else
  fail "4 ranks, injected: two runs gave different epoch times: $(epoch_seconds "$tmp/inj-4a.jsonl" | paste -sd' ') vs $(epoch_seconds "$tmp/inj-4b.jsonl" | paste -sd' ')"
fi

# Refused in one line, naming the flag.
refused() {
  local what=$1 expect=$2 out=$tmp/refused.out
  shift 2
  if "$@" >"$out" 2>&1; then
    fail "$what: not refused"
  elif ! grep -q -- "$expect" "$out"; then
    fail "$what: the error does not say '$expect':"
    cat "$out"
  else
    echo "ok   $what refused: $(grep -m1 -- "$expect" "$out")"
  fi
}
echo "{not json" >"$tmp/bad.json"
refused "a table that is not JSON" "--compute-table '$tmp/bad.json': not JSON" \
  simulate 1 "$tmp/refused.out" injected -- "${flags[@]}" --compute-table "$tmp/bad.json"
echo '{"nodes": {"fc1.matmul+bias+relu": [[100, -1]]}}' >"$tmp/bad.json"
refused "a negative time" "node 'fc1.matmul+bias+relu': point 0 is \[100,-1\]" \
  simulate 1 "$tmp/refused.out" injected -- "${flags[@]}" --compute-table "$tmp/bad.json"
refused "--compute-table in the real build" \
  "error: --compute-table applies to a simulated run only" \
  env OMP_NUM_THREADS=1 "$mlp" "${flags[@]}" --compute-table "$tmp/table.json"

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "injected compute: all checks passed"
