#!/usr/bin/env bash
# Pipeline parallelism (--pipeline-stages, --micro-batches, --schedule): in deterministic mode the
# MLP cut into 2 stages (GPipe and 1F1B) and 3 stages, one rank each, and 2 stages x 2
# data-parallel replicas, saves parameters bitwise identical to the one-process run with
# --micro-batch of batch / M (the ragged last batch has fewer micro-batches); so does cifar_cnn
# (oneDNN's blocked layouts inside the stages) on 2 and 3 stages when the CIFAR-10 data are there,
# and cifar_resnet (BatchNorm on both stages: running statistics included) on 2 and on 2 stages
# x 2 replicas, a cut inside its residual block refused; --profile reports every stage's bubble
# and --trace marks it; a checkpoint written by 2
# stages resumes on 1 process and on 3 stages with the same bits; --stage-boundaries cuts where
# it is told; --dump-schedule writes every stage's actions; flags that do not combine and a
# stage count without its ranks are refused with one line.
# Usage: pipeline.sh path/to/mnist_mlp path/to/cifar_cnn path/to/mpirun [CIFAR_DIR [path/to/cifar_resnet]]
set -u
mlp=$1 cifar=$2 mpirun=$3 cifar_dir=${4:-} resnet=${5:-}
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 300 40 # batches of 64: 4 full, then 44 (micro-batches 16, 16, 12)

launch() {
  local ranks=$1
  shift
  on_layout "$ranks" 1 "$mlp" --threads 1 "$@"
}

flags=(--data "$tmp/data" --seed 3 --momentum 0.9 --lr 0.05 --deterministic)
if ! launch 1 "${flags[@]}" --epochs 2 --micro-batch 16 --save "$tmp/ref.safetensors" >"$tmp/ref.out" 2>&1; then
  fail "the reference run failed: $(cat "$tmp/ref.out")"
fi

# same NAME RANKS FLAGS...: a pipelined run's parameters against the reference's.
same() {
  local name=$1 ranks=$2
  shift 2
  if ! launch "$ranks" "${flags[@]}" --epochs 2 "$@" --save "$tmp/$name.safetensors" >"$tmp/$name.out" 2>&1; then
    fail "$name: the run failed:"
    cat "$tmp/$name.out"
  elif cmp -s "$tmp/ref.safetensors" "$tmp/$name.safetensors"; then
    echo "ok   $name: bitwise identical to one process with --micro-batch 16"
  else
    fail "$name: parameters differ from one process with --micro-batch 16"
  fi
}
same gpipe-2 2 --pipeline-stages 2 --micro-batches 4 --stage-balance flops
same 1f1b-2 2 --pipeline-stages 2 --micro-batches 4 --schedule 1f1b
same gpipe-3 3 --pipeline-stages 3 --micro-batches 4
same 1f1b-3 3 --pipeline-stages 3 --micro-batches 4 --schedule 1f1b
same gpipe-2x2 4 --pipeline-stages 2 --micro-batches 4
same boundary-2 2 --pipeline-stages 2 --micro-batches 4 --stage-boundaries act2
if grep -q "pipeline: 2 stages, cut after 'act2.relu'" "$tmp/boundary-2.out"; then
  echo "ok   --stage-boundaries act2 cuts after act2's last node"
else
  fail "--stage-boundaries act2: $(cat "$tmp/boundary-2.out")"
fi

if grep -q "pipeline: 2 stages, cut after 'act1.relu'.*balanced by forward FLOPs" "$tmp/gpipe-2.out"; then
  echo "ok   the cut and the stages' shares are printed (--stage-balance flops)"
else
  fail "no cut printed: $(cat "$tmp/gpipe-2.out")"
fi
# The default cut balances the profiled time (the runs above by it are bitwise identical too:
# the profiled steps change nothing).
if grep -Eq "pipeline: 2 stages, cut after .*profiled time per stage \(forward and backward\): [0-9.]+ ms \([0-9.]+%\) [0-9.]+ ms .*balanced by profiled time" "$tmp/1f1b-2.out"; then
  echo "ok   the default cut balances the profiled time: $(grep -o "pipeline: 2 stages.*" "$tmp/1f1b-2.out" | head -1)"
else
  fail "no cut by profiled time: $(cat "$tmp/1f1b-2.out")"
fi

# cifar_cnn (batch 32: micro-batches of 8) on 256 CIFAR-10 samples, if present.
if [ -n "$cifar_dir" ] && { [ -e "$cifar_dir/test_batch.bin" ] || [ -e "$cifar_dir/test_batch.bin.gz" ]; }; then
  # The example's default backend: oneDNN where built in, its blocked layout on the values the
  # stages send each other (they travel plain).
  cflags=(--data "$cifar_dir" --train-limit 256 --test-limit 100 --epochs 1 --seed 5 --threads 1
    --deterministic)
  if ! on_layout 1 1 "$cifar" "${cflags[@]}" --micro-batch 8 --save "$tmp/cifar-ref.safetensors" \
    >"$tmp/cifar-ref.out" 2>&1; then
    fail "cifar_cnn: the reference run failed: $(cat "$tmp/cifar-ref.out")"
  fi
  for run in "2 gpipe" "2 1f1b" "3 1f1b"; do
    read -r stages schedule <<<"$run"
    if ! on_layout "$stages" 1 "$cifar" "${cflags[@]}" --pipeline-stages "$stages" \
      --micro-batches 4 --schedule "$schedule" --save "$tmp/cifar-$stages-$schedule.safetensors" \
      >"$tmp/cifar.out" 2>&1; then
      fail "cifar_cnn $run: the run failed: $(cat "$tmp/cifar.out")"
    elif cmp -s "$tmp/cifar-ref.safetensors" "$tmp/cifar-$stages-$schedule.safetensors"; then
      echo "ok   cifar_cnn on $stages stages ($schedule): bitwise identical to one process"
    else
      fail "cifar_cnn on $stages stages ($schedule): parameters differ from one process"
    fi
  done
  # The automatic cut balances the profiled time, and says so.
  if grep -q "pipeline: 3 stages, cut after .*balanced by profiled time" "$tmp/cifar.out"; then
    echo "ok   cifar_cnn's cut balances the profiled time: $(grep -o "pipeline: 3 stages.*" "$tmp/cifar.out" | head -1)"
  else
    fail "cifar_cnn: no cut by profiled time printed: $(cat "$tmp/cifar.out")"
  fi
  # cifar_resnet: BatchNorm in both stages (its running statistics are gathered from the stage
  # that updates them, like the parameters) and a residual network cut between two blocks.
  if [ -n "$resnet" ]; then
    rflags=(--data "$cifar_dir" --train-limit 64 --test-limit 32 --epochs 1 --batch-size 32
      --seed 5 --threads 1 --deterministic)
    if ! on_layout 1 1 "$resnet" "${rflags[@]}" --micro-batch 8 \
      --save "$tmp/resnet-ref.safetensors" >"$tmp/resnet-ref.out" 2>&1; then
      fail "cifar_resnet: the reference run failed: $(cat "$tmp/resnet-ref.out")"
    elif ! on_layout 2 1 "$resnet" "${rflags[@]}" --pipeline-stages 2 --micro-batches 4 \
      --save "$tmp/resnet-2.safetensors" >"$tmp/resnet-2.out" 2>&1; then
      fail "cifar_resnet on 2 stages: the run failed: $(cat "$tmp/resnet-2.out")"
    elif cmp -s "$tmp/resnet-ref.safetensors" "$tmp/resnet-2.safetensors"; then
      echo "ok   cifar_resnet on 2 stages: bitwise identical to one process, running statistics included"
      grep "pipeline:" "$tmp/resnet-2.out" | head -1
    else
      fail "cifar_resnet on 2 stages: parameters or buffers differ from one process"
    fi
    # Inside a residual block two values cross (the body's and the shortcut's): refused.
    if on_layout 2 1 "$resnet" "${rflags[@]}" --pipeline-stages 2 --micro-batches 4 \
      --stage-boundaries layer1.0.relu1 >"$tmp/resnet-in.out" 2>&1; then
      fail "cifar_resnet: a cut inside a residual block was accepted"
    elif grep -qF "the forward cannot be cut after 'layer1.0.relu1': 2 values cross there (one must)" \
      "$tmp/resnet-in.out"; then
      echo "ok   cifar_resnet: a cut inside a residual block is refused (2 values cross)"
    else
      fail "cifar_resnet inside a block: $(cat "$tmp/resnet-in.out")"
    fi
    # 2 stages x 2 data-parallel replicas: each micro-batch normalised by its own statistics,
    # the running statistics' sums taken over the stage's replicas in the tree, as data
    # parallelism does: the bits of one process again.
    if ! timeout 300 "$mpirun" -np 4 --oversubscribe --bind-to none -x OMP_WAIT_POLICY=passive \
      -x OMP_NUM_THREADS=1 "$resnet" "${rflags[@]}" --pipeline-stages 2 --micro-batches 4 \
      --save "$tmp/resnet-2x2.safetensors" >"$tmp/resnet-2x2.out" 2>&1; then
      fail "cifar_resnet on 2 stages x 2 replicas: the run failed: $(cat "$tmp/resnet-2x2.out")"
    elif cmp -s "$tmp/resnet-ref.safetensors" "$tmp/resnet-2x2.safetensors"; then
      echo "ok   cifar_resnet on 2 stages x 2 replicas: bitwise identical to one process, running statistics included"
    else
      fail "cifar_resnet on 2 stages x 2 replicas: parameters or buffers differ from one process"
    fi
  fi
else
  echo "skip cifar_cnn: no CIFAR-10 data"
fi

# A checkpoint of 2 stages (the epoch boundary) resumes on 1 process and on 3 stages.
if ! launch 2 "${flags[@]}" --epochs 1 --pipeline-stages 2 --micro-batches 4 \
  --checkpoint-dir "$tmp/ck" >"$tmp/ck.out" 2>&1; then
  fail "the checkpointing run failed: $(cat "$tmp/ck.out")"
else
  for resume in "1" "3 --pipeline-stages 3 --micro-batches 4"; do
    read -r -a r <<<"$resume"
    if ! launch "${r[@]}" "${flags[@]}" --epochs 2 --micro-batch 16 --resume "$tmp/ck" \
      --save "$tmp/resumed.safetensors" >"$tmp/resumed.out" 2>&1; then
      fail "resume on ${r[0]} rank(s) failed: $(cat "$tmp/resumed.out")"
    elif cmp -s "$tmp/ref.safetensors" "$tmp/resumed.safetensors"; then
      echo "ok   a 2-stage checkpoint resumed on ${r[0]} rank(s): bitwise identical"
    else
      fail "a 2-stage checkpoint resumed on ${r[0]} rank(s): parameters differ"
    fi
  done
fi

# --profile: every stage's bubble (its receives' waits over its step time) beside the ideal, and
# its time per step by kind, printed and in --metrics; --trace: the waits are spans of their own
# ("bubble", category idle) on every stage's timeline, each followed by the rest of its receive.
if ! launch 2 "${flags[@]}" --epochs 1 --pipeline-stages 2 --micro-batches 4 --schedule 1f1b \
  --profile --trace "$tmp/pipe-trace.json" --metrics "$tmp/pipe-metrics.jsonl" >"$tmp/prof.out" 2>&1; then
  fail "the profiled run failed: $(cat "$tmp/prof.out")"
elif ! grep -Eq "pipeline bubble \(idle in receives / step time\): stage 0 [0-9.]+% stage 1 [0-9.]+%, ideal \(P-1\)/\(M\+P-1\) = 20.0%" "$tmp/prof.out" ||
  ! grep -Eq "stage 1 per step: forward [0-9.]+ ms  backward [0-9.]+ ms  update [0-9.]+ ms  communication [0-9.]+ ms  idle [0-9.]+ ms" "$tmp/prof.out"; then
  fail "--profile: no bubble per stage: $(cat "$tmp/prof.out")"
elif ! /usr/bin/python3 - "$tmp/pipe-trace.json" "$tmp/pipe-metrics.jsonl" <<'PY'
import json, sys
spans = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
problems = []
for rank in (0, 1):
    mine = sorted((e for e in spans if e["pid"] == rank), key=lambda e: (e["tid"], e["ts"]))
    bubbles = [i for i, e in enumerate(mine) if e["name"] == "bubble"]
    if not bubbles:
        problems.append(f"rank {rank}: no bubble span")
    for i in bubbles:
        e, after = mine[i], mine[i + 1] if i + 1 < len(mine) else None
        if e["cat"] != "idle" or e["args"].get("op") != "recv" or "recv" not in e["args"].get("waited in", ""):
            problems.append(f"rank {rank}: bad bubble span {e}")
        elif after is None or after["args"].get("op") != "recv" or after["cat"] != "communication" or abs(after["ts"] - e["ts"] - e["dur"]) > 0.01:
            problems.append(f"rank {rank}: bubble {e} not followed by its receive ({after})")
    if any(e["cat"] == "idle" and e["name"] != "bubble" for e in mine):
        problems.append(f"rank {rank}: an idle span not named bubble")
epochs = [r for r in map(json.loads, open(sys.argv[2])) if "epoch" in r]
for r in epochs:
    stages = r.get("pipeline_stage_times", [])
    if len(stages) != 2 or not 0 <= r.get("pipeline_bubble", -1) < 1 or abs(r.get("pipeline_bubble_ideal", 0) - 0.2) > 1e-9:
        problems.append(f"metrics: {r}")
    for s in stages:
        if not (0 <= s["bubble"] < 1 and s["forward_seconds"] > 0 and s["backward_seconds"] > 0 and s["idle_seconds"] >= 0):
            problems.append(f"metrics of a stage: {s}")
if not epochs:
    problems.append("no epoch record in --metrics")
for p in problems:
    print("FAIL:", p)
sys.exit(1 if problems else 0)
PY
then
  fail "--trace / --metrics of the profiled pipeline"
else
  echo "ok   --profile prints every stage's bubble and times; --trace marks the waits as bubble spans"
  grep "pipeline bubble" "$tmp/prof.out"
fi

# --dump-schedule: every stage's list.
if launch 2 "${flags[@]}" --epochs 1 --pipeline-stages 2 --micro-batches 2 --schedule 1f1b \
  --dump-schedule "$tmp/schedule.txt" >"$tmp/dump.out" 2>&1 &&
  grep -qx "stage 0 (rank 0): F0 send-act0->1 F1 recv-grad0<-1 send-act1->1 B0 recv-grad1<-1 B1 update" "$tmp/schedule.txt" &&
  grep -qx "stage 1 (rank 1): recv-act0<-0 F0 B0 send-grad0->0 recv-act1<-0 F1 B1 send-grad1->0 update" "$tmp/schedule.txt"; then
  echo "ok   --dump-schedule lists every stage's actions"
else
  fail "--dump-schedule: $(cat "$tmp/dump.out" "$tmp/schedule.txt" 2>&1)"
fi

# A killed stage (rank 1, after step 3) ends the job: no rank waits for it, nothing is saved.
rm -f "$tmp/killed.safetensors"
if MINIDL_TEST_KILL_AFTER_STEP=3 MINIDL_TEST_KILL_RANK=1 timeout 60 "$mpirun" -np 2 --oversubscribe \
  --bind-to none -x OMP_WAIT_POLICY=passive -x OMP_NUM_THREADS=1 -x MINIDL_TEST_KILL_AFTER_STEP \
  -x MINIDL_TEST_KILL_RANK "$mlp" --threads 1 "${flags[@]}" --epochs 1 --pipeline-stages 2 \
  --save "$tmp/killed.safetensors" >"$tmp/killed.out" 2>&1; then
  fail "a killed stage: the job succeeded"
elif [ $? -eq 124 ]; then
  fail "a killed stage: the job was still running after 60 s"
elif [ -e "$tmp/killed.safetensors" ]; then
  fail "a killed stage: parameters were saved"
else
  echo "ok   a killed stage ends the job, nothing saved"
fi

# refused RANKS MESSAGE FLAGS...: fails with one line containing MESSAGE.
refused() {
  local ranks=$1 message=$2
  shift 2
  if launch "$ranks" "${flags[@]}" --epochs 1 "$@" >"$tmp/refused.out" 2>&1; then
    fail "accepted: $*"
  elif grep -qF -- "$message" "$tmp/refused.out"; then
    echo "ok   refused: $* ($message)"
  else
    fail "$*: expected '$message', got: $(cat "$tmp/refused.out")"
  fi
}
refused 1 "--pipeline-stages 2 needs a multiple of 2 ranks (stages x data-parallel replicas); this job has 1 rank(s)" \
  --pipeline-stages 2
refused 2 "the forward cannot be cut after 'fc1': the next op is fused into it" \
  --pipeline-stages 2 --stage-boundaries fc1
refused 2 "--micro-batches 5 does not divide --batch-size 64" --pipeline-stages 2 --micro-batches 5
refused 1 "--zero" --pipeline-stages 2 --zero 1
refused 1 "--schedule" --schedule 1f1b
refused 2 "--stage-balance" --pipeline-stages 2 --stage-balance memory
refused 1 "--schedule" --pipeline-stages 2 --schedule zigzag

[ "$fails" -eq 0 ] || exit 1
