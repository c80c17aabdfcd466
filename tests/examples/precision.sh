#!/usr/bin/env bash
# --precision: a bad value and a CPU without AVX512-BF16 or AMX-BF16 (as oneDNN sees it under
# DNNL_MAX_CPU_ISA=AVX512_CORE) are refused with one line naming the problem. Where the CPU has
# bf16 units, the MLP (native kernels preferred) and the MNIST CNN (oneDNN's) train with their
# products and convolutions in oneDNN's bf16 kernels (the dispatch log names them), end near the
# f32 run but not on its bits, and in deterministic mode give the same bits on 1x1, 1x2 and 2x1
# ranks x threads. The CNN keeps its activations between bf16 kernels in bf16 (on AMX; with
# AVX512-BF16 alone its 1 -> 8 channel convolution stays f32). Checkpoints resume across
# precisions.
# Exits 77 (skipped) after the refusals on a CPU without bf16 units.
# Usage: precision.sh path/to/mnist_mlp path/to/mnist_cnn path/to/mpirun
set -u
mlp=$1 cnn=$2 mpirun=$3
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
synthetic_idx "$tmp/data" 256 64

# refused NAME SUBSTRING CMD...: non-zero exit, one stderr line containing SUBSTRING, no file.
refused() {
  local name=$1 want=$2
  shift 2
  "$@" --save "$tmp/refused.safetensors" >"$tmp/out" 2>"$tmp/err"
  local rc=$? lines
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -qF -- "$want" "$tmp/err" ||
    [ -e "$tmp/refused.safetensors" ]; then
    fail "$name: exit $rc, $lines stderr lines, wanted '$want':"
    cat "$tmp/err"
  else
    echo "ok   $name: $(cat "$tmp/err")"
  fi
}

refused bad-value "expected f32 or bf16" "$mlp" --data "$tmp/data" --precision fp16
refused no-bf16-cpu "AVX512-BF16 or AMX-BF16" env DNNL_MAX_CPU_ISA=AVX512_CORE \
  "$mlp" --data "$tmp/data" --precision bf16

# Does this CPU compute in bf16? One step tells.
if ! "$mlp" --data "$tmp/data" --precision bf16 --max-steps 1 >"$tmp/probe" 2>&1; then
  if grep -q "AVX512-BF16 or AMX-BF16" "$tmp/probe"; then
    echo "skip: $(cat "$tmp/probe")"
    [ "$fails" -eq 0 ] && exit 77
    exit 1
  fi
  fail "probe: a one-step bf16 run failed:"
  cat "$tmp/probe"
  exit 1
fi

# run NAME BIN FLAGS...: trains, saving $tmp/NAME.safetensors and the output in $tmp/NAME.out.
run() {
  local name=$1
  shift
  if ! "$@" --save "$tmp/$name.safetensors" >"$tmp/$name.out" 2>&1; then
    fail "$name: the run failed:"
    cat "$tmp/$name.out"
  fi
}
# final_loss NAME: the last epoch's training loss.
final_loss() { grep -o "^epoch.*loss *[0-9.]*" "$tmp/$1.out" | tail -1 | awk '{print $NF}'; }

for model in mlp cnn; do
  bin=$mlp flags=(--hidden 32 --lr 0.05) epochs=3
  # The CNN on oneDNN's kernels: its ReLU backward, and the native pooling (preferred over
  # oneDNN's), then run on bf16 activations.
  [ $model = cnn ] && bin=$cnn flags=(--lr 0.05 --backend onednn) epochs=2
  run $model-f32 "$bin" --data "$tmp/data" --seed 5 "${flags[@]}" --epochs $epochs
  MINIDL_VERBOSE=dispatch,layouts,reorders run $model-bf16 "$bin" --data "$tmp/data" --seed 5 "${flags[@]}" \
    --epochs $epochs --precision bf16
  # The CNN's convolution forward (8 filters: no AMX kernel of minidl's takes it). Its weight
  # gradient, with the pooling's backward, runs the f32 kernel of conv2d_bwd_weights_bias_pooled.
  op=matmul
  [ $model = cnn ] && op=conv2d
  if grep -q "$op .*-> onednn bf16" "$tmp/$model-bf16.out"; then
    echo "ok   $model: the dispatch log names bf16 kernels ($op)"
  elif [ $model = cnn ] &&
    grep -q "conv2d_bwd_weights .*stays f32 (fewer than 16 input and output channels" \
      "$tmp/$model-bf16.out" &&
    grep -q "matmul .*-> onednn bf16" "$tmp/$model-bf16.out"; then
    # AVX512-BF16 without AMX: the bf16 convolutions run in nChw16c, whose blocks the CNN's
    # 1 -> 8 channel convolution fills on neither side: it stays f32 (mixed-precision says so)
    # and its classifier's products run in bf16.
    echo "ok   $model: the convolution stays f32 (1 -> 8 channels fill no nChw16c block), the products run bf16"
  else
    fail "$model: no $op node runs a bf16 kernel:"
    grep -m5 -- "->" "$tmp/$model-bf16.out"
  fi
  if [ $model = cnn ]; then
    # The CNN's activations between bf16 kernels are stored as bf16 (the layouts log), the
    # native pooling after its convolution runs on them, and the reorders log names the conversions
    # from f32 (the input image, the weights).
    if grep -q "of conv2d .* bf16$" "$tmp/$model-bf16.out" &&
      grep -q "max_pool2d .*-> native bf16" "$tmp/$model-bf16.out" &&
      grep -q "\[reorders\] conv2d .* f32 .* -> bf16 " "$tmp/$model-bf16.out"; then
      echo "ok   $model: bf16 activations between bf16 kernels ($(grep -c " bf16$" "$tmp/$model-bf16.out") values)"
    elif grep -q "no activation stored as bf16: .* layout nChw16c (blocks of 16)" "$tmp/$model-bf16.out"; then
      # AVX512-BF16 without AMX: oneDNN's bf16 convolutions run in nChw16c, which the CNN's
      # 8-channel activations cannot fill, so they stay f32 (each convolution converts).
      echo "ok   $model: no bf16 activations, as the layouts log says: 8 channels do not fill nChw16c"
    else
      fail "$model: no bf16 activation, no native bf16 pooling or no conversion logged:"
      grep -m10 "bf16" "$tmp/$model-bf16.out"
    fi
  fi
  if cmp -s "$tmp/$model-f32.safetensors" "$tmp/$model-bf16.safetensors"; then
    fail "$model: bf16 gave the f32 run's bits"
  fi
  f32=$(final_loss $model-f32) bf16=$(final_loss $model-bf16)
  # The same training up to bf16's rounding: the final losses within 5% of each other.
  if awk -v a="$f32" -v b="$bf16" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 0.05 * a) }'; then
    echo "ok   $model: final loss $bf16 in bf16, $f32 in f32"
  else
    fail "$model: final loss $bf16 in bf16 against $f32 in f32"
  fi
  # Deterministic mode: the layouts give the same bits in bf16 too.
  for layout in 1x1 1x2 2x1; do
    if ! on_layout "${layout%x*}" "${layout#*x}" "$bin" --threads "${layout#*x}" --data "$tmp/data" \
      --seed 5 "${flags[@]}" --epochs 1 --precision bf16 --deterministic \
      --save "$tmp/$model-det-$layout.safetensors" >"$tmp/$model-det-$layout.out" 2>&1; then
      fail "$model deterministic $layout: the run failed:"
      cat "$tmp/$model-det-$layout.out"
      continue
    fi
    [ $layout = 1x1 ] && continue
    if cmp -s "$tmp/$model-det-1x1.safetensors" "$tmp/$model-det-$layout.safetensors"; then
      echo "ok   $model deterministic bf16 $layout: bitwise identical to 1x1"
    else
      fail "$model deterministic bf16 $layout: parameters differ from 1x1"
    fi
  done
done
# Checkpoints hold f32 tensors whatever the precision: a bf16 run resumes in f32 and an f32 run in
# bf16, with a note naming the changed setting, and trains on.
for pair in bf16:f32 f32:bf16; do
  from=${pair%:*} to=${pair#*:}
  run ck-$from "$cnn" --data "$tmp/data" --seed 5 --lr 0.05 --backend onednn --epochs 1 --precision "$from" \
    --checkpoint-dir "$tmp/ck-$from"
  run resumed-$to "$cnn" --data "$tmp/data" --seed 5 --lr 0.05 --backend onednn --epochs 2 --precision "$to" \
    --resume "$tmp/ck-$from"
  if grep -q "resumed from" "$tmp/resumed-$to.out" && grep -q "note: .*precision" "$tmp/resumed-$to.out" &&
    [ -n "$(final_loss resumed-$to)" ]; then
    echo "ok   a $from checkpoint resumes in $to (final loss $(final_loss resumed-$to))"
  else
    fail "a $from checkpoint did not resume in $to:"
    cat "$tmp/resumed-$to.out"
  fi
done
[ "$fails" -eq 0 ]
