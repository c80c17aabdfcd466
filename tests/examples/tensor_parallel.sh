#!/usr/bin/env bash
# Tensor parallelism (--tensor-parallel): the MLP's Linear pair split over 2 shards (2 ranks,
# and 4 ranks as 2 replicas x 2 shards) ends a short run with parameters within 1e-5 (relative,
# per tensor, in the 2-norm) of the one-process run's; in deterministic mode it saves the same
# bytes on 2 and on 4 ranks (and 2 threads per rank, and 2 ranks on separate nodes, whose
# partial sums go through MPI instead of shared memory); a checkpoint of a tensor-parallel run
# (whole tensors, the usual file) resumes with and without --tensor-parallel and at another
# shard count, and a plain one with it; the metrics' per-rank memory figures give each shard its half of the split
# parameters' gradients and optimizer state, and the bytes per step handed to collectives are
# the pair's; the CIFAR CNN's fc1 pair (gradients flowing on into the convolutions) when
# data/cifar10 is there; combinations that do not apply are refused naming the flags.
# Usage: tensor_parallel.sh path/to/mnist_mlp path/to/cifar_cnn path/to/mpirun CIFAR_DIR
set -u
mlp=$1 cifar=$2 mpirun=$3 cifar_data=$4
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 320 40 # batches of 64: 5 steps an epoch

launch() {
  local ranks=$1 bin=$2
  shift 2
  on_layout "$ranks" 1 "$bin" --threads 1 "$@"
}
run() { # NAME RANKS BIN FLAGS...: a run that must succeed, its output in $tmp/NAME.out
  local name=$1
  shift
  launch "$@" >"$tmp/$name.out" 2>&1 || fail "$name: the run failed: $(cat "$tmp/$name.out")"
}

# close A B TOL: every tensor of B within TOL of A's, relative, per tensor in the 2-norm; the
# same names and shapes.
close() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, math, struct, sys
from array import array
def load(path):  # a safetensors file: {name: (shape, values)}
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    header.pop("__metadata__", None)
    out = {}
    for k, v in header.items():
        b, e = v["data_offsets"]
        values = array("f") if v["dtype"] == "F32" else array("b")
        values.frombytes(data[b:e])
        out[k] = (v["shape"], values)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
tol = float(sys.argv[3])
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
worst = 0.0
for k in a:
    (sa, x), (sb, y) = a[k], b[k]
    assert sa == sb, (k, sa, sb)
    n = math.sqrt(sum(float(v) * v for v in x))
    d = math.sqrt(sum((float(p) - q) ** 2 for p, q in zip(x, y)))
    worst = max(worst, d / (n if n > 0 else 1.0))
print(f"largest relative difference {worst:.2e}")
sys.exit(0 if worst <= tol else 1)
PY
}

base=(--data "$tmp/data" --hidden 64,32 --epochs 1 --seed 3 --lr 0.05 --momentum 0.9)
run serial 1 "$mlp" "${base[@]}" --save "$tmp/serial.safetensors"
run tp2 2 "$mlp" "${base[@]}" --tensor-parallel 2 --save "$tmp/tp2.safetensors"
run tp2x2 4 "$mlp" "${base[@]}" --tensor-parallel 2 --save "$tmp/tp2x2.safetensors"
for r in tp2 tp2x2; do
  if d=$(close "$tmp/serial.safetensors" "$tmp/$r.safetensors" 1e-5); then
    echo "ok   $r: parameters after one epoch within 1e-5 of the one-process run ($d)"
  else
    fail "$r: parameters differ from the one-process run by more than 1e-5 ($d)"
  fi
done

# Deterministic mode: the same bytes on 2 ranks (1 replica x 2 shards) and 4 (2 x 2).
det=(--data "$tmp/data" --hidden 64,32 --epochs 2 --seed 3 --optimizer adamw --lr 0.01
  --weight-decay 0.01 --deterministic --tensor-parallel 2)
run det2 2 "$mlp" "${det[@]}" --save "$tmp/det2.safetensors"
run det4 4 "$mlp" "${det[@]}" --save "$tmp/det4.safetensors"
# 2 threads per rank: the micro-shards' sections hold collectives and run one after another.
on_layout 2 2 "$mlp" --threads 2 "${det[@]}" --save "$tmp/det2t2.safetensors" >"$tmp/det2t2.out" 2>&1 ||
  fail "det2t2: the run failed: $(cat "$tmp/det2t2.out")"
# Shards on one node hand their partial sums over through shared memory; told they are on
# separate nodes (one rank per node), through MPI's allgather: the same bytes.
MINIDL_RANKS_PER_NODE=1 run det2n 2 "$mlp" "${det[@]}" --save "$tmp/det2n.safetensors"
if cmp -s "$tmp/det2.safetensors" "$tmp/det4.safetensors" &&
  cmp -s "$tmp/det2.safetensors" "$tmp/det2t2.safetensors" &&
  cmp -s "$tmp/det2.safetensors" "$tmp/det2n.safetensors"; then
  echo "ok   --deterministic --tensor-parallel 2: the same bytes on 2 ranks, 4 ranks, 2x2 threads" \
    "and 2 ranks on separate nodes"
else
  fail "--deterministic --tensor-parallel 2: 2 ranks, 4 ranks, 2 threads and 2 nodes saved" \
    "different bytes"
fi

# A checkpoint at step 3 of the deterministic AdamW run (killed right after it), resumed on 4
# ranks with --tensor-parallel 2: the bytes of the uninterrupted run; resumed on 1 rank without
# it: within 1e-5 of them. The file holds the tensors of a run without --tensor-parallel.
MINIDL_TEST_KILL_AFTER_STEP=3 launch 2 "$mlp" "${det[@]}" --checkpoint-dir "$tmp/ck" \
  --checkpoint-every-steps 3 >"$tmp/killed.out" 2>&1 && fail "the run meant to die exited 0"
run resumed4 4 "$mlp" "${det[@]}" --resume "$tmp/ck" --save "$tmp/resumed4.safetensors"
if ! grep -q "resumed from .*(training step 3)" "$tmp/resumed4.out"; then
  fail "resumed4: did not resume from step 3: $(cat "$tmp/resumed4.out")"
elif cmp -s "$tmp/det2.safetensors" "$tmp/resumed4.safetensors"; then
  echo "ok   a --tensor-parallel checkpoint resumed on 4 ranks: the uninterrupted run's bytes"
else
  fail "a --tensor-parallel checkpoint resumed on 4 ranks: parameters differ"
fi
# At another shard count: 4 shards of one replica take their parts of the same whole tensors.
det_t4=("${det[@]:0:${#det[@]}-1}" 4)
run resumed_t4 4 "$mlp" "${det_t4[@]}" --resume "$tmp/ck" --save "$tmp/resumed_t4.safetensors"
if ! grep -q "resumed from .*(training step 3)" "$tmp/resumed_t4.out"; then
  fail "resumed_t4: did not resume from step 3: $(cat "$tmp/resumed_t4.out")"
elif d=$(close "$tmp/det2.safetensors" "$tmp/resumed_t4.safetensors" 1e-5); then
  echo "ok   a --tensor-parallel 2 checkpoint resumed with --tensor-parallel 4 on 4 ranks ($d)"
else
  fail "a --tensor-parallel 2 checkpoint resumed with --tensor-parallel 4: more than 1e-5 apart ($d)"
fi
plain=("${det[@]:0:${#det[@]}-2}")
run resumed1 1 "$mlp" "${plain[@]}" --resume "$tmp/ck" --save "$tmp/resumed1.safetensors"
if d=$(close "$tmp/det2.safetensors" "$tmp/resumed1.safetensors" 1e-5); then
  echo "ok   a --tensor-parallel checkpoint resumed on 1 rank without it ($d)"
else
  fail "a --tensor-parallel checkpoint resumed without it: more than 1e-5 apart ($d)"
fi
# A plain checkpoint resumed with --tensor-parallel 2.
run plain 1 "$mlp" "${plain[@]}" --save "$tmp/plain.safetensors"
MINIDL_TEST_KILL_AFTER_STEP=3 launch 1 "$mlp" "${plain[@]}" --checkpoint-dir "$tmp/ck1" \
  --checkpoint-every-steps 3 >"$tmp/killed1.out" 2>&1 && fail "the run meant to die exited 0"
run resumed_tp 2 "$mlp" "${det[@]}" --resume "$tmp/ck1" --save "$tmp/resumed_tp.safetensors"
if d=$(close "$tmp/plain.safetensors" "$tmp/resumed_tp.safetensors" 1e-5); then
  echo "ok   a plain checkpoint resumed with --tensor-parallel 2 on 2 ranks ($d)"
else
  fail "a plain checkpoint resumed with --tensor-parallel 2: more than 1e-5 apart ($d)"
fi
header() { python3 -c "import json,struct,sys; f=open(sys.argv[1],'rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n)); h.pop('__metadata__',None); print(sorted((k,v['shape']) for k,v in h.items()))" "$1"; }
# Step 3 of the first epoch: no epoch done, 3 steps into the first.
ck=ckpt-e0000-s000003.safetensors
if [ ! -f "$tmp/ck/$ck" ] || [ ! -f "$tmp/ck1/$ck" ]; then
  fail "no checkpoint $ck: $(ls "$tmp/ck" "$tmp/ck1")"
elif [ "$(header "$tmp/ck/$ck")" = "$(header "$tmp/ck1/$ck")" ]; then
  echo "ok   a --tensor-parallel checkpoint holds the same tensors as one without it"
else
  fail "a --tensor-parallel checkpoint's tensors differ from a plain one's"
fi

# Memory: each shard holds half of fc1.weight, fc1.bias and fc2.weight, of their gradients and
# of their AdamW state (2 x 4 bytes per element), all of the rest.
mem=(--data "$tmp/data" --hidden 64,32 --optimizer adamw --max-steps 1 --quiet)
run mem0 1 "$mlp" "${mem[@]}" --metrics "$tmp/mem0.jsonl"
run mem2 2 "$mlp" "${mem[@]}" --tensor-parallel 2 --metrics "$tmp/mem2.jsonl"
if python3 - "$tmp" <<'PY'; then
import json, sys
d = sys.argv[1]
def ranks(name):
    with open(f"{d}/{name}.jsonl") as f:
        for line in f:
            rec = json.loads(line)
            if "config" in rec:
                return rec["config"]["memory_bytes"]
whole, = ranks("mem0")
rest = 64 + 32 * 64 + 32 + 10 * 32 + 10  # all but fc1.weight [64, pixels]
pixels = (whole["gradients"] // 4 - rest) // 64
assert whole["gradients"] == 4 * (64 * pixels + rest), whole
split = (64 * pixels + 64 + 32 * 64) // 2 + 32 + 10 * 32 + 10
for r in ranks("mem2"):
    assert r["gradients"] == 4 * split, (r, 4 * split)
    assert r["optimizer_state"] == 8 * split, (r, 8 * split)
    assert r["parameters"] == 4 * split, (r, 4 * split)
assert whole["parameters"] == whole["gradients"], whole
# Bytes per step handed to collectives by rank 0: tp_reduce's [64, 32] partial products only
# (one replica: no gradient reduction; the parameters are never gathered); none on one rank.
def epoch(name):
    with open(f"{d}/{name}.jsonl") as f:
        return [json.loads(l) for l in f if '"epoch"' in l][0]
e0, e2 = epoch("mem0"), epoch("mem2")
assert e0["steps"] == e2["steps"] == 1 and e0["comm_bytes_per_step"] == 0, (e0, e2)
want = 4 * 64 * 32
assert e2["comm_bytes_per_step"] == want, (e2, want)
# The step's FLOPs over all ranks: each shard computes its half of the split pair, and both the
# unsplit classifier (fc3); the first layer has no data gradient.
per = 2 * (2 * pixels * 64) + 3 * (2 * 64 * 32) + 3 * (2 * 32 * 10)
assert e0["flops"] == 64 * per, (e0["flops"], 64 * per)
assert e2["flops"] == 64 * (per + 3 * 2 * 32 * 10), (e2["flops"], 64 * per)
PY
  echo "ok   memory per rank: each shard keeps its half of the split parameters, gradients and state;" \
    "bytes per step to collectives; the step's FLOPs over both shards"
else
  fail "memory per rank with --tensor-parallel 2"
fi

# The CIFAR CNN: fc1 and fc2 split; the gradient of fc1's input reaches the convolutions
# through tp_copy's backward (an allreduce over the shards).
if [ -f "$cifar_data/data_batch_1.bin" ] || [ -f "$cifar_data/data_batch_1.bin.gz" ]; then
  cnn=(--data "$cifar_data" --train-limit 256 --test-limit 64 --epochs 1 --seed 3 --lr 0.02
    --batch-size 64)
  run cnn1 1 "$cifar" "${cnn[@]}" --save "$tmp/cnn1.safetensors"
  run cnn2 2 "$cifar" "${cnn[@]}" --tensor-parallel 2 --save "$tmp/cnn2.safetensors"
  if d=$(close "$tmp/cnn1.safetensors" "$tmp/cnn2.safetensors" 1e-5); then
    echo "ok   cifar_cnn --tensor-parallel 2 on 2 ranks: within 1e-5 of one process ($d)"
  else
    fail "cifar_cnn --tensor-parallel 2: more than 1e-5 from one process ($d)"
  fi
else
  echo "skip cifar_cnn: no CIFAR-10 data in $cifar_data"
fi

# Bad uses: one clear line each, naming the flags.
expect() { # RANKS WANT FLAGS...
  local ranks=$1 want=$2
  shift 2
  if launch "$ranks" "$mlp" --data "$tmp/data" --epochs 1 "$@" >/dev/null 2>"$tmp/err"; then
    fail "accepted: $*"
  elif ! grep -qF -- "$want" "$tmp/err"; then
    fail "$*: wanted '$want', got: $(cat "$tmp/err")"
  elif [ "$(grep -c "^mnist_mlp" "$tmp/err")" -ne 1 ]; then # mpirun adds its own banner
    fail "$*: more than one line: $(cat "$tmp/err")"
  fi
}
expect 3 "--tensor-parallel 2 needs a rank count divisible by 2, got 3 rank(s)" --tensor-parallel 2
expect 1 "--tensor-parallel 2 needs a rank count divisible by 2, got 1 rank(s)" --tensor-parallel 2
expect 1 "--zero excludes --tensor-parallel" --tensor-parallel 2 --zero 1
expect 1 "--clip-grad-norm excludes --tensor-parallel" --tensor-parallel 2 --clip-grad-norm 1
expect 2 "does not combine with --thread-mode replicas" --tensor-parallel 2 --thread-mode replicas
expect 2 "got --reduce root" --tensor-parallel 2 --reduce root
expect 2 "which do not split into 2 equal shards" --tensor-parallel 2 --hidden 63,32
expect 2 "the model has no pair of Linear layers" --tensor-parallel 2 --hidden ""
[ "$fails" -eq 0 ] && echo "ok   bad uses: one clear line each"
exit $((fails > 0))
