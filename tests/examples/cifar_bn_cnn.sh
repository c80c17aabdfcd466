#!/usr/bin/env bash
# ctest examples.cifar_bn_cnn: the small BatchNorm CNN trains one short epoch on the first 320
# CIFAR-10 training images with its own defaults (SGD, momentum 0.9, learning rate 0.01, batch
# 32), exits 0 with a finite training and test loss, and saves its 20138 parameters and
# BatchNorm's buffers under the names conv1, bn1, conv2, bn2, fc. When PyTorch is at hand,
# bench/pytorch_reference.py's twin has exactly those names and shapes. Exits 77 (ctest:
# skipped) without the CIFAR-10 files ($MINIDL_DATA_DIR).
# Usage: cifar_bn_cnn.sh path/to/cifar_bn_cnn
set -u
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cifar_one_epoch "$1"
/usr/bin/python3 - "$tmp/metrics.jsonl" "$tmp/model.safetensors" "$here" <<'PY' || fail "the run's metrics or saved state"
import sys
metrics, saved, here = sys.argv[1:]
sys.path.insert(0, here)
import model_checks as mc
mc.check_one_epoch(metrics, (("batch_size", 32), ("momentum", 0.9), ("lr", 0.01),
                             ("parameters", 20138)))
ours = mc.saved_tensors(saved)
want = {"conv1.weight": ("F32", (32, 3, 3, 3)), "conv2.weight": ("F32", (64, 32, 3, 3)),
        "fc.weight": ("F32", (10, 64)), "fc.bias": ("F32", (10,))}
for bn, c in (("bn1", 32), ("bn2", 64)):
    want.update({f"{bn}.{p}": ("F32", (c,)) for p in ("weight", "bias", "running_mean",
                                                       "running_var")})
    want[f"{bn}.num_batches_tracked"] = ("I64", ())
if ours != want:
    diff = sorted(set(ours.items()) ^ set(want.items()))
    sys.exit(f"saved tensors differ from the model's: {diff}")
mc.check_twin("cifar_bn_cnn", ours)
PY

[ "$fails" -eq 0 ] && echo "cifar_bn_cnn ok"
exit "$fails"
