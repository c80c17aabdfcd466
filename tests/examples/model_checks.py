"""Checks the example tests of the CIFAR models share (cifar_resnet.sh, cifar_bn_cnn.sh): one
epoch's metrics with the example's defaults, the tensors a --save wrote, and the PyTorch twin's
state_dict (bench/pytorch_reference.py) with the same names, shapes and dtypes. Each function
exits with a one-line reason on a mismatch."""
import json
import math
import os
import struct
import subprocess
import sys

# bench/, where pytorch_reference.py defines the twins: two folders above this file's.
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "bench")


def check_one_epoch(metrics, config_wants):
    """The --metrics file of a one-epoch run: its config record has config_wants (key, value
    pairs), and its one epoch record finite training and test losses."""
    records = [json.loads(line) for line in open(metrics)]
    config = records[0]["config"]
    for key, want in config_wants:
        if config.get(key) != want:
            sys.exit(f"config {key} is {config.get(key)!r}, expected {want!r}")
    epochs = [r for r in records if "epoch" in r]
    if len(epochs) != 1:
        sys.exit(f"{len(epochs)} epoch records, expected 1")
    for key in ("train_loss", "test_loss"):
        if not math.isfinite(epochs[0][key]):
            sys.exit(f"{key} is {epochs[0][key]}")


def saved_tensors(path):
    """{name: (dtype, shape)} of a .safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in header.items() if k != "__metadata__"}


def check_twin(model, ours):
    """The PyTorch twin of model has exactly the tensors ours ({name: (dtype, shape)}); without
    PyTorch, says so and checks nothing."""
    code = f"""
import json, sys
sys.path.insert(0, {BENCH!r})
try:
    import pytorch_reference as r
except ImportError:  # no torch (or numpy): nothing to compare with
    print("null")
    sys.exit()
dtypes = {{'torch.float32': 'F32', 'torch.int64': 'I64'}}
print(json.dumps({{k: (dtypes[str(t.dtype)], list(t.shape))
                  for k, t in r.model({model!r}).state_dict().items()}}))
"""
    out = json.loads(subprocess.run(["/usr/bin/python3", "-c", code], capture_output=True,
                                    text=True, check=True).stdout)
    if out is None:
        print("note: no PyTorch, the twin's names are not compared")
        return
    theirs = {k: (v[0], tuple(v[1])) for k, v in out.items()}
    if theirs != ours:
        diff = sorted(set(theirs.items()) ^ set(ours.items()))
        sys.exit(f"the PyTorch twin's state_dict differs: {diff[:6]}")
    print(f"the PyTorch twin has the same {len(ours)} tensors")
