#!/usr/bin/env bash
# --trace writes one valid Chrome trace for the whole job (a process per rank, complete events
# with names, categories, times and lengths; on several ranks, communication events too), and
# --profile prints the per-node table with GFLOP/s (and min/max over the ranks) over the steps
# after each program's first, and the first steps' kernel time apart.
# Usage: trace_profile.sh path/to/mnist_mlp [LAUNCHER ARGS...]   (e.g. mpirun -np 2)
set -u
bin=$1
shift
launcher=("$@")
ranks=1
for ((i = 0; i < ${#launcher[@]}; ++i)); do
  [ "${launcher[$i]}" = -np ] && ranks=${launcher[$((i + 1))]}
done
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=synthetic_idx.sh
source "$here/synthetic_idx.sh"
synthetic_idx "$tmp/data" 300 40
if ! "${launcher[@]}" "$bin" --data "$tmp/data" --hidden 32 --epochs 1 --batch-size 16 \
  --threads 1 --profile --trace "$tmp/trace.json" >"$tmp/out" 2>&1; then
  echo "FAIL: the run failed"
  cat "$tmp/out"
  exit 1
fi
fails=0
grep -q "GFLOP/s" "$tmp/out" || { echo "FAIL: no GFLOP/s column in the profile table"; fails=1; }
grep -qE "^ +[0-9.]+ +[0-9.]+% .* [0-9.]+ +matmul " "$tmp/out" ||
  { echo "FAIL: no matmul row in the profile table"; fails=1; }
grep -qE "^kernel time per node \(training steps after each program's first, .*; the first steps' kernels took [0-9.]+ s" "$tmp/out" ||
  { echo "FAIL: the profile table does not leave out and report the first steps"; fails=1; }
if [ "$ranks" -gt 1 ]; then
  grep -q "min/max over $ranks ranks" "$tmp/out" || { echo "FAIL: no min/max over ranks"; fails=1; }
fi
! ls "$tmp" | grep -q '\.tmp' || { echo "FAIL: temporary trace left behind"; fails=1; }
/usr/bin/python3 - "$tmp/trace.json" "$ranks" <<'PY' || fails=1
import json, sys
path, ranks = sys.argv[1], int(sys.argv[2])
with open(path) as f:
    trace = json.load(f)  # fails on invalid JSON
events = trace["traceEvents"]
spans = [e for e in events if e.get("ph") == "X"]
problems = []
if not spans:
    problems.append("no complete events")
for e in spans:
    if not (isinstance(e["ts"], (int, float)) and isinstance(e["dur"], (int, float))
            and e["ts"] >= 0 and e["dur"] >= 0 and e["name"] and e["cat"]):
        problems.append(f"bad event {e}")
        break
pids = sorted({e["pid"] for e in spans})
if pids != list(range(ranks)):
    problems.append(f"events from processes {pids}, expected ranks 0..{ranks - 1}")
names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
if names != {f"rank {r}" for r in range(ranks)}:
    problems.append(f"process names {names}")
cats = {e["cat"] for e in spans}
if "compute" not in cats or "update" not in cats:
    problems.append(f"categories {cats} lack compute or update")
if ranks > 1 and "communication" not in cats:
    problems.append(f"categories {cats} lack communication")
if any(e["cat"] == "idle" or e["name"] == "bubble" for e in spans):
    problems.append("a bubble (idle) span in a run without pipeline stages")
if not any(e["args"].get("op") == "matmul" and e["args"].get("GFLOP/s", 0) > 0 for e in spans):
    problems.append("no matmul event with a GFLOP/s figure")
for p in problems:
    print("FAIL:", p)
sys.exit(1 if problems else 0)
PY
[ "$fails" -eq 0 ] && echo "trace and profile: ok"
exit "$fails"
