#!/usr/bin/env bash
# ZeRO (--zero 1, --zero 2): in deterministic mode the MLP trained with AdamW (with global-norm
# clipping, the norm summed from the ranks' shards) and with SGD momentum saves parameters
# bitwise identical to the one-process run without --zero, on 2, 3 (uneven shards) and 4 ranks;
# a --zero 2 checkpoint of 4 ranks (its optimizer state gathered into the usual single file)
# resumes on 2 ranks with --zero 2, and on 1 rank without --zero, continuing with the same bits;
# the metrics' per-rank memory figures show the state (and with --zero 2 the gradients) sharded;
# combinations that do not apply are refused with one line naming the flags.
# The MNIST CNN (convolutions, its micro-shards on 2 threads per rank) with --zero 2 on 3 ranks
# gives the one-process bits too. With gradient accumulation (--accumulate 2 on 2 and 3 ranks,
# --zero 1 and 2) the same bits as the one-process run of the same global batch; outside
# deterministic mode the same parameters within rounding.
# Usage: zero.sh path/to/mnist_mlp path/to/mnist_cnn path/to/mpirun
set -u
mlp=$1 cnn=$2 mpirun=$3
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 300 40 # batches of 64: 4 full, then 44 (6 micro-shards of 8)

launch() {
  local ranks=$1 bin=$2
  shift 2
  on_layout "$ranks" 1 "$bin" --threads 1 "$@"
}

# --hidden 600,16: fc1.weight has 470400 elements, more than one norm chunk, so shards cut
# through it (and through the other parameters) at chunk boundaries.
base=(--data "$tmp/data" --hidden 600,16 --epochs 2 --seed 3 --deterministic)
adamw=("${base[@]}" --optimizer adamw --lr 0.01 --weight-decay 0.01 --clip-grad-norm 0.5)
sgd=("${base[@]}" --momentum 0.9 --lr 0.05)

norms() { grep -o "grad norm [0-9.]*" "$1"; }

# check NAME FLAGS...: the one-process run without --zero against N ranks with --zero Z.
check() {
  local name=$1
  shift
  if ! launch 1 "$mlp" "$@" --save "$tmp/$name-ref.safetensors" >"$tmp/$name-ref.out" 2>&1; then
    fail "$name: the reference run failed: $(cat "$tmp/$name-ref.out")"
    return
  fi
  for z in 1 2; do
    for n in 2 3 4; do
      local run=$name-z$z-n$n
      if ! launch "$n" "$mlp" "$@" --zero "$z" --save "$tmp/$run.safetensors" >"$tmp/$run.out" 2>&1; then
        fail "$run: the run failed:"
        cat "$tmp/$run.out"
      elif cmp -s "$tmp/$name-ref.safetensors" "$tmp/$run.safetensors"; then
        echo "ok   $name --zero $z on $n ranks: bitwise identical to 1 rank without --zero"
      else
        fail "$name --zero $z on $n ranks: parameters differ from 1 rank without --zero"
      fi
    done
  done
}
check adamw "${adamw[@]}"
check sgd "${sgd[@]}"

# Gradient accumulation: the micro-steps' gradients are summed (in deterministic mode joined
# across the ranks in the tree as each micro-step ends), then the apply program takes this
# rank's shard, updates it and all-gathers. --batch-size 32 --accumulate 2 (and 16 x 4) must
# give the bits of the one-process run with batches of 64 (with --reduce hierarchical too: the
# tree joined by node first).
for run in "1 2 32 2" "2 2 32 2" "1 3 32 2" "2 3 32 2" "2 2 16 4" "2 3 32 2 hierarchical"; do
  read -r z n b k reduce <<<"$run"
  name=accumulate-z$z-n$n-b$b-k$k${reduce:+-$reduce}
  what="--zero $z --batch-size $b --accumulate $k${reduce:+ --reduce $reduce} on $n ranks"
  if ! launch "$n" "$mlp" "${adamw[@]}" --zero "$z" --batch-size "$b" --accumulate "$k" \
    --reduce "${reduce:-allreduce}" --save "$tmp/$name.safetensors" >"$tmp/$name.out" 2>&1; then
    fail "$name: the run failed: $(cat "$tmp/$name.out")"
  elif cmp -s "$tmp/adamw-ref.safetensors" "$tmp/$name.safetensors"; then
    echo "ok   $what: bitwise identical to 1 rank with batches of 64"
  else
    fail "$what: parameters differ from 1 rank"
  fi
done
if [ "$(norms "$tmp/adamw-ref.out")" = "$(norms "$tmp/accumulate-z2-n3-b32-k2.out")" ]; then
  echo "ok   the gradient norm of --zero 2 --accumulate 2 on 3 ranks is the replicated run's"
else
  fail "gradient norms differ: $(norms "$tmp/adamw-ref.out") vs" \
    "$(norms "$tmp/accumulate-z2-n3-b32-k2.out")"
fi

# Outside deterministic mode MPI sums the ranks' accumulated gradients (allreduce, or
# reduce-scatter with --zero 2): the parameters equal the one-process run's within rounding.
# close A B: every parameter within 1e-3 absolute of the other run's, after 2 epochs of AdamW.
close() {
  python3 - "$1" "$2" <<'PY'
import json, struct, sys
def load(path):
    blob = open(path, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        lo, hi = v["data_offsets"]
        out[k] = struct.unpack(f"<{(hi - lo) // 4}f", blob[8 + n + lo:8 + n + hi])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k]))
print(f"largest difference {worst:.3g}")
sys.exit(0 if worst <= 1e-3 else 1)
PY
}
nondet=()
for f in "${adamw[@]}"; do [ "$f" = --deterministic ] || nondet+=("$f"); done
if ! launch 1 "$mlp" "${nondet[@]}" --save "$tmp/nondet-ref.safetensors" >"$tmp/nondet-ref.out" 2>&1; then
  fail "the non-deterministic reference run failed: $(cat "$tmp/nondet-ref.out")"
fi
for run in "1 2" "2 2" "1 3" "2 3"; do
  read -r z n <<<"$run"
  name=nondet-accumulate-z$z-n$n
  if ! launch "$n" "$mlp" "${nondet[@]}" --zero "$z" --batch-size 32 --accumulate 2 \
    --save "$tmp/$name.safetensors" >"$tmp/$name.out" 2>&1; then
    fail "$name: the run failed: $(cat "$tmp/$name.out")"
  elif diff=$(close "$tmp/nondet-ref.safetensors" "$tmp/$name.safetensors"); then
    echo "ok   --zero $z --accumulate 2 on $n ranks, not deterministic: $diff from 1 rank"
  else
    fail "--zero $z --accumulate 2 on $n ranks, not deterministic: $diff from 1 rank" \
      "(expected within 1e-3)"
  fi
done
synthetic_idx "$tmp/cnn-data" 304 40
cnn_flags=(--data "$tmp/cnn-data" --epochs 1 --lr 0.05 --momentum 0.9 --clip-grad-norm 1 --seed 3
  --deterministic --micro-batch 4)
if ! launch 1 "$cnn" "${cnn_flags[@]}" --save "$tmp/cnn-ref.safetensors" >"$tmp/cnn.out" 2>&1 ||
  ! on_layout 3 2 "$cnn" --threads 2 "${cnn_flags[@]}" --zero 2 --save "$tmp/cnn-z2.safetensors" \
    >>"$tmp/cnn.out" 2>&1; then
  fail "cnn: a run failed: $(cat "$tmp/cnn.out")"
elif cmp -s "$tmp/cnn-ref.safetensors" "$tmp/cnn-z2.safetensors"; then
  echo "ok   cnn --zero 2 on 3 ranks x 2 threads: bitwise identical to 1 rank without --zero"
else
  fail "cnn --zero 2 on 3 ranks x 2 threads: parameters differ from 1 rank without --zero"
fi

# The printed gradient norm (from the shards) is the replicated run's.
if [ -n "$(norms "$tmp/adamw-ref.out")" ] &&
  [ "$(norms "$tmp/adamw-ref.out")" = "$(norms "$tmp/adamw-z2-n3.out")" ]; then
  echo "ok   the gradient norm of --zero 2 on 3 ranks is the replicated run's"
else
  fail "gradient norms differ: $(norms "$tmp/adamw-ref.out") vs $(norms "$tmp/adamw-z2-n3.out")"
fi

# A --zero 2 checkpoint of 4 ranks, written at step 7 (mid-epoch) by a run killed right after
# it, resumed on 2 ranks (--zero 2) and on 1 (no --zero): both must end as the reference.
MINIDL_TEST_KILL_AFTER_STEP=7 launch 4 "$mlp" "${adamw[@]}" --zero 2 --checkpoint-dir "$tmp/ck" \
  --checkpoint-every-steps 7 >"$tmp/killed.out" 2>&1 && fail "the run meant to die exited 0"
for resumed in "2 --zero 2" "1"; do
  read -r n zero <<<"$resumed"
  name=resumed-$n
  # shellcheck disable=SC2086
  if ! launch "$n" "$mlp" "${adamw[@]}" $zero --resume "$tmp/ck" --save "$tmp/$name.safetensors" \
    >"$tmp/$name.out" 2>&1; then
    fail "$name: the resume failed:"
    cat "$tmp/$name.out"
  elif ! grep -q "resumed from .*(training step 7)" "$tmp/$name.out"; then
    fail "$name: did not resume from the checkpoint of step 7: $(cat "$tmp/$name.out")"
  elif cmp -s "$tmp/adamw-ref.safetensors" "$tmp/$name.safetensors"; then
    echo "ok   --zero 2 checkpoint of 4 ranks resumed on $n rank(s) ${zero:-without --zero}:" \
      "bitwise identical to the uninterrupted run"
  else
    fail "--zero 2 checkpoint of 4 ranks resumed on $n rank(s): parameters differ"
  fi
done
# The checkpoint is the usual file: the same tensors, names and shapes as one of a run without
# --zero (the optimizer state whole).
launch 1 "$mlp" "${adamw[@]}" --max-steps 7 --checkpoint-dir "$tmp/ck-plain" \
  --checkpoint-every-steps 7 >"$tmp/plain.out" 2>&1 || fail "the plain checkpoint run failed: $(cat "$tmp/plain.out")"
header() { python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n)); h.pop('__metadata__',None); print(sorted((k,v['shape']) for k,v in h.items()))" "$1"; }
if [ "$(header "$tmp/ck-plain/ckpt-e0001-s000002.safetensors")" = \
  "$(header "$tmp/ck/ckpt-e0001-s000002.safetensors")" ]; then
  echo "ok   a --zero 2 checkpoint holds the same tensors as one without --zero"
else
  fail "a --zero 2 checkpoint's tensors differ from a plain one's"
fi

# Memory accounting: the metrics' config record gives every rank's bytes; with --zero 1 on 4
# ranks each rank's optimizer state is at most 30% of the whole (the shards are near-equal), the
# ranks' pieces add up to the whole, and --zero 2 gives each rank only its shard of the reduced
# gradients.
mem=(--data "$tmp/data" --hidden 2048,16 --optimizer adamw --max-steps 1 --quiet)
for z in 0 1 2; do
  launch 4 "$mlp" "${mem[@]}" --zero "$z" --metrics "$tmp/mem-$z.jsonl" >"$tmp/mem-$z.out" 2>&1 ||
    fail "memory run --zero $z failed: $(cat "$tmp/mem-$z.out")"
done
if python3 - "$tmp" <<'PY'; then
import json, sys
d = sys.argv[1]
mem = {z: json.loads(open(f"{d}/mem-{z}.jsonl").readline())["config"]["memory_bytes"] for z in "012"}
whole = mem["0"][0]
same = lambda a, b: {k: v for k, v in a.items() if k != "rank"} == {k: v for k, v in b.items() if k != "rank"}
assert len(mem["1"]) == 4 and all(same(r, whole) for r in mem["0"]), mem["0"]
assert sum(r["optimizer_state"] for r in mem["1"]) == whole["optimizer_state"], mem["1"]
assert all(r["optimizer_state"] <= 0.3 * whole["optimizer_state"] for r in mem["1"]), mem["1"]
assert all(r["parameters"] == whole["parameters"] for r in mem["1"] + mem["2"])
assert all(r["gradients"] == whole["gradients"] for r in mem["1"]), mem["1"]
assert sum(r["gradients"] for r in mem["2"]) == whole["gradients"], mem["2"]
assert all(r["gradients"] <= 0.3 * whole["gradients"] for r in mem["2"]), mem["2"]
PY
  echo "ok   memory: --zero 1 shards the optimizer state over 4 ranks, --zero 2 the gradients too"
else
  fail "memory figures of the metrics' config record"
fi

# Bad uses end in one line naming the problem.
expect() {
  local want=$1
  shift
  if "$mlp" --data "$tmp/data" --epochs 1 --threads 1 "$@" >/dev/null 2>"$tmp/err"; then
    fail "accepted: $*"
  elif [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
    fail "$*: wanted one line with '$want', got: $(cat "$tmp/err")"
  fi
}
expect "--overlap excludes --zero" --zero 1 --overlap
expect "--reduce root does not apply" --zero 1 --reduce root
expect "--zero: Value 3 not in range 0 to 2" --zero 3
[ "$fails" -eq 0 ] && echo "ok   bad uses: one clear line each"
exit $((fails > 0))
