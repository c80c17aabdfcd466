#!/usr/bin/env bash
# A run killed during its second epoch and resumed from its checkpoint ends with a parameter
# file bitwise identical to an uninterrupted run's: resumed at an epoch boundary
# (--checkpoint-every 1) and in the middle of an epoch (--checkpoint-every-steps). The kill is
# the example's testing hook MINIDL_TEST_KILL_AFTER_STEP (SIGKILL after that training step).
# Also: a resume with another --seed mid-epoch is refused, and scripts/read-checkpoint reads
# the checkpoint (when python3 has numpy).
# Usage: checkpoint_resume.sh path/to/mnist_mlp [LAUNCHER...]   e.g. mpirun -np 2 --oversubscribe
set -u
bin=$1
shift
launcher=("$@")
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 300 40

# 300 samples in batches of 16: 19 steps per epoch (the last of 12 samples).
launch() {
  "${launcher[@]}" "$bin" --data "$tmp/data" --hidden "${HIDDEN:-32}" --epochs 2 \
    --batch-size 16 --momentum 0.9 --threads 1 "$@"
}
run() { launch --seed 5 --lr 0.05 "$@"; }

run --save "$tmp/A.safetensors" >"$tmp/A.out" 2>&1 || { fail "uninterrupted run"; cat "$tmp/A.out"; }

# killed: MINIDL_TEST_KILL_AFTER_STEP=S run ... ; the run must die in epoch 2 (after the
# first epoch's line, before the second's) and leave no --save file.
killed() {
  local name=$1 step=$2
  shift 2
  MINIDL_TEST_KILL_AFTER_STEP=$step run --save "$tmp/$name-killed.safetensors" "$@" \
    >"$tmp/$name-killed.out" 2>&1
  local rc=$?
  [ "$rc" -ne 0 ] || fail "$name: the run meant to be killed after step $step exited 0"
  grep -q "epoch  1/2" "$tmp/$name-killed.out" || fail "$name: killed before epoch 1 ended"
  ! grep -q "epoch  2/2" "$tmp/$name-killed.out" || fail "$name: killed after epoch 2 ended"
  [ ! -e "$tmp/$name-killed.safetensors" ] || fail "$name: the killed run saved its parameters"
}

# resumed NAME CKPT_DIR [FLAGS]: resume from the directory's newest checkpoint, compare with A.
resumed() {
  local name=$1 dir=$2
  shift 2
  if run --resume "$dir" --save "$tmp/$name.safetensors" "$@" >"$tmp/$name.out" 2>&1; then
    if cmp "$tmp/A.safetensors" "$tmp/$name.safetensors"; then
      echo "ok   $name: bitwise identical ($(grep -o 'resumed from .*' "$tmp/$name.out"))"
    else
      fail "$name: the resumed run's parameters differ from the uninterrupted run's"
    fi
  else
    fail "$name: resume failed:"
    cat "$tmp/$name.out"
  fi
}

# At an epoch boundary: a checkpoint after epoch 1, killed 5 steps into epoch 2.
killed boundary 24 --checkpoint-dir "$tmp/ck1" --checkpoint-every 1
[ -f "$tmp/ck1/ckpt-e0001-s000000.safetensors" ] || fail "boundary: no ckpt-e0001-s000000"
# (checkpointing on into the same directory)
resumed boundary "$tmp/ck1" --checkpoint-dir "$tmp/ck1"
[ -f "$tmp/ck1/ckpt-e0002-s000000.safetensors" ] || fail "boundary: the resumed run wrote no checkpoint"
# A new run does not mix its checkpoints with those of another.
if run --checkpoint-dir "$tmp/ck1" >"$tmp/mix.out" 2>&1; then
  fail "a new run checkpointed into a directory with another run's checkpoints"
elif ! grep -q "already holds 2 checkpoint(s) past where this run starts" "$tmp/mix.out"; then
  fail "mixing checkpoints: unclear error: $(cat "$tmp/mix.out")"
fi

# Mid-epoch: a checkpoint every 4 steps (the last before the kill at step 28, 9 steps into
# epoch 2), keeping 2.
killed midepoch 30 --checkpoint-dir "$tmp/ck2" --checkpoint-every-steps 4 --checkpoint-keep 2
got=$(cd "$tmp/ck2" && ls)
want=$'ckpt-e0001-s000005.safetensors\nckpt-e0001-s000009.safetensors'
[ "$got" = "$want" ] || fail "midepoch: checkpoints kept: $got, wanted: $want"
resumed midepoch "$tmp/ck2"

# The comparison can fail: another learning rate after the resume (allowed, with a note) ends
# elsewhere.
launch --seed 5 --lr 0.0501 --resume "$tmp/ck2" --save "$tmp/lr.safetensors" >"$tmp/lr.out" 2>&1 ||
  fail "resume with another --lr failed: $(cat "$tmp/lr.out")"
grep -q -- "note: --lr is 0.05 in the checkpoint, 0.0501 here" "$tmp/lr.out" ||
  fail "no note about the other --lr: $(cat "$tmp/lr.out")"
if cmp -s "$tmp/A.safetensors" "$tmp/lr.safetensors"; then
  fail "a resume with another --lr gave the same parameters"
else
  echo "ok   another --lr after the resume: noted, and the parameters differ"
fi

# Another seed inside an epoch would follow another order: refused, naming the flag.
if launch --lr 0.05 --seed 6 --resume "$tmp/ck2" >"$tmp/seed.out" 2>&1; then
  fail "a resume with another --seed mid-epoch was accepted"
elif ! grep -q -- "--seed is 5 in the checkpoint, 6 here" "$tmp/seed.out"; then
  fail "the refused resume did not name --seed:"
  cat "$tmp/seed.out"
else
  echo "ok   seed: $(grep -o 'checkpoint .*' "$tmp/seed.out" | head -1)"
fi

# Bad uses end in one line naming the problem (one process only: mpirun adds lines of its own).
if [ ${#launcher[@]} -eq 0 ]; then
  expect() {
    local want=$1
    shift
    if run "$@" >/dev/null 2>"$tmp/err"; then
      fail "accepted: $*"
    elif [ "$(wc -l <"$tmp/err")" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err"; then
      fail "$*: wanted one line with '$want', got: $(cat "$tmp/err")"
    fi
  }
  expect "--checkpoint-every requires --checkpoint-dir" --checkpoint-every 2
  expect "--init excludes --resume" --resume "$tmp/ck2" --init "$tmp/A.safetensors"
  expect "is not a minidl checkpoint" --resume "$tmp/A.safetensors"
  HIDDEN=16 expect "tensor 'fc1.weight': expected F32 [16,64], found F32 [32,64]" \
    --resume "$tmp/ck2"
  expect "holds no checkpoint" --resume "$tmp/data"
  [ "$fails" -eq 0 ] && echo "ok   bad uses: one clear line each"
fi

# The open format: the Python reader lists the tensors and the metadata, and loads them as
# numpy arrays when imported; with the interpreter of its #! line.
reader=$here/../../scripts/read-checkpoint
python=$(head -1 "$reader" | cut -c3-)
if "$python" -c 'import numpy' 2>/dev/null; then
  if "$reader" "$tmp/ck2" >"$tmp/read.out" 2>&1 &&
    grep -q "^fc1.weight  *F32  *\[32,64\]" "$tmp/read.out" &&
    grep -q "^optimizer.fc1.weight.momentum_buffer  *F32" "$tmp/read.out" &&
    grep -q "^  epoch_step = 9$" "$tmp/read.out"; then
    echo "ok   read-checkpoint prints the tensors and the metadata"
  else
    fail "read-checkpoint:"
    cat "$tmp/read.out"
  fi
  if "$python" - "$reader" "$tmp/ck2" "$tmp/A.safetensors" <<'PY' >"$tmp/module.out" 2>&1; then
import importlib.machinery, importlib.util, sys
sys.dont_write_bytecode = True
loader = importlib.machinery.SourceFileLoader("read_checkpoint", sys.argv[1])
rc = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
loader.exec_module(rc)
arrays, meta = rc.load(sys.argv[2])
assert arrays["fc1.weight"].shape == (32, 64) and arrays["fc1.weight"].dtype == "float32"
assert arrays["optimizer.fc2.bias.momentum_buffer"].shape == (10,)
assert meta["step"] == "28" and meta["seed"] == "5", meta
final, _ = rc.load(sys.argv[3])
assert sorted(final) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
assert (final["fc1.weight"] != arrays["fc1.weight"]).any()  # trained on after the checkpoint
PY
    echo "ok   read-checkpoint as a module"
  else
    fail "read-checkpoint as a module:"
    cat "$tmp/module.out"
  fi
else
  echo "skip read-checkpoint: $python has no numpy"
fi
exit $((fails > 0))
