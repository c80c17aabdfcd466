#!/usr/bin/env bash
# ctest examples.cifar_bn_cnn: the small BatchNorm CNN trains one short epoch on the first 320
# CIFAR-10 training images with its own defaults (SGD, momentum 0.9, learning rate 0.01, batch
# 32), exits 0 with a finite training and test loss, and saves its 20138 parameters and
# BatchNorm's buffers under the names conv1, bn1, conv2, bn2, fc. When PyTorch is at hand,
# bench/pytorch_reference.py's twin has exactly those names and shapes. Exits 77 (ctest:
# skipped) without the CIFAR-10 files ($MINIDL_DATA_DIR).
# Usage: cifar_bn_cnn.sh path/to/cifar_bn_cnn
set -u
bin=$1
# shellcheck source=common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
data=${MINIDL_DATA_DIR:-}
if [ -z "$data" ] || ! ls "$data"/data_batch_1.bin* >/dev/null 2>&1; then
  echo "skipped: no CIFAR-10 files in MINIDL_DATA_DIR='$data' (scripts/fetch-data cifar10)"
  exit 77
fi

if ! "$bin" --data "$data" --epochs 1 --train-limit 320 --test-limit 200 --threads 1 \
  --metrics "$tmp/metrics.jsonl" --save "$tmp/model.safetensors" >"$tmp/out" 2>&1; then
  cat "$tmp/out"
  echo "FAIL: the run failed"
  exit 1
fi
cat "$tmp/out"
root=$(cd "$here/../.." && pwd)
/usr/bin/python3 - "$tmp/metrics.jsonl" "$tmp/model.safetensors" "$root" <<'PY' || fail "the run's metrics or saved state"
import json, math, struct, subprocess, sys
metrics, saved, root = sys.argv[1:]
records = [json.loads(line) for line in open(metrics)]
config = records[0]["config"]
for key, want in (("batch_size", 32), ("momentum", 0.9), ("lr", 0.01), ("parameters", 20138)):
    if config.get(key) != want:
        sys.exit(f"config {key} is {config.get(key)!r}, expected {want!r}")
epochs = [r for r in records if "epoch" in r]
if len(epochs) != 1:
    sys.exit(f"{len(epochs)} epoch records, expected 1")
for key in ("train_loss", "test_loss"):
    if not math.isfinite(epochs[0][key]):
        sys.exit(f"{key} is {epochs[0][key]}")

with open(saved, "rb") as f:
    blob = f.read()
n = struct.unpack("<Q", blob[:8])[0]
header = {k: v for k, v in json.loads(blob[8:8 + n]).items() if k != "__metadata__"}
ours = {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items()}
want = {"conv1.weight": ("F32", (32, 3, 3, 3)), "conv2.weight": ("F32", (64, 32, 3, 3)),
        "fc.weight": ("F32", (10, 64)), "fc.bias": ("F32", (10,))}
for bn, c in (("bn1", 32), ("bn2", 64)):
    want.update({f"{bn}.{p}": ("F32", (c,)) for p in ("weight", "bias", "running_mean",
                                                       "running_var")})
    want[f"{bn}.num_batches_tracked"] = ("I64", ())
if ours != want:
    diff = sorted(set(ours.items()) ^ set(want.items()))
    sys.exit(f"saved tensors differ from the model's: {diff}")

# The PyTorch twin's state_dict: the same names, shapes and dtypes.
code = f"""
import json, sys
sys.path.insert(0, {root + '/bench'!r})
import pytorch_reference as r
dtypes = {{'torch.float32': 'F32', 'torch.int64': 'I64'}}
print(json.dumps({{k: (dtypes[str(t.dtype)], list(t.shape))
                  for k, t in r.model('cifar_bn_cnn').state_dict().items()}}))
"""
if subprocess.run(["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode:
    print("note: no PyTorch, the twin's names are not compared")
else:
    out = subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True, text=True,
                         check=True).stdout
    theirs = {k: (v[0], tuple(v[1])) for k, v in json.loads(out).items()}
    if theirs != ours:
        diff = sorted(set(theirs.items()) ^ set(ours.items()))
        sys.exit(f"the PyTorch twin's state_dict differs: {diff[:6]}")
    print(f"the PyTorch twin has the same {len(ours)} tensors")
PY

[ "$fails" -eq 0 ] && echo "cifar_bn_cnn ok"
exit "$fails"
