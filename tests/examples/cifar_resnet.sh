#!/usr/bin/env bash
# ctest examples.cifar_resnet: ResNet-20 trains one short epoch on the first 320 CIFAR-10
# training images with its own defaults (Nesterov SGD, weight decay, warm-up and cosine
# schedule, augmentation), exits 0 with a finite training and test loss, and saves the
# state_dict of ResNet-20 with option B shortcuts under torchvision's names: 272474 parameters,
# BatchNorm's buffers included. When PyTorch is at hand, bench/pytorch_reference.py's twin has
# exactly those names and shapes. Exits 77 (ctest: skipped) without the CIFAR-10 files
# ($MINIDL_DATA_DIR).
# Usage: cifar_resnet.sh path/to/cifar_resnet
set -u
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cifar_one_epoch "$1"
/usr/bin/python3 - "$tmp/metrics.jsonl" "$tmp/model.safetensors" "$here" <<'PY' || fail "the run's metrics or saved state"
import sys
metrics, saved, here = sys.argv[1:]
sys.path.insert(0, here)
import model_checks as mc
mc.check_one_epoch(metrics, (("batch_size", 128), ("nesterov", True), ("weight_decay", 5e-4),
                             ("momentum", 0.9), ("lr", 0.1), ("parameters", 272474)))
ours = mc.saved_tensors(saved)
want = {"conv1.weight": ("F32", (16, 3, 3, 3)), "bn1.running_var": ("F32", (16,)),
        "layer1.0.conv1.weight": ("F32", (16, 16, 3, 3)),
        "layer2.0.conv1.weight": ("F32", (32, 16, 3, 3)),
        "layer2.0.shortcut.0.weight": ("F32", (32, 16, 1, 1)),
        "layer2.0.shortcut.1.running_mean": ("F32", (32,)),
        "layer3.2.bn2.bias": ("F32", (64,)), "fc.weight": ("F32", (10, 64)),
        "fc.bias": ("F32", (10,))}
for name, spec in want.items():
    if ours.get(name) != spec:
        sys.exit(f"'{name}' is {ours.get(name)}, expected {spec}")
for name in ours:
    if ".shortcut." in name and not name.startswith(("layer2.0.", "layer3.0.")):
        sys.exit(f"'{name}': only the first block of stages 2 and 3 has a shortcut of its own")
if any(".bias" in k and "conv" in k for k in ours):
    sys.exit("a convolution has a bias")
mc.check_twin("cifar_resnet", ours)
PY

[ "$fails" -eq 0 ] && echo "cifar_resnet ok"
exit "$fails"
