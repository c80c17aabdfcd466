#!/usr/bin/python3
"""The three reference models in PyTorch, trained like minidl's examples: the same data files,
model shapes, initialisation (He normal for layers followed by ReLU, Xavier uniform for the
output layer, zero biases), SGD settings, batch sizes and epochs. Prints one JSON line per epoch:
{"epoch", "epoch_seconds", "train_loss", "test_accuracy"}, where epoch_seconds is the wall time
of the epoch's training steps with their batch gathering (evaluation excluded), as minidl's
metrics define it.

usage: pytorch_reference.py MODEL --data DIR [--epochs N] [--threads T] [--seed S]
                            [--train-limit N] [--test-limit N] [--no-shuffle]
                            [--save-init FILE.safetensors] [--minidl-order]
MODEL: mnist_mlp, mnist_cnn or cifar_cnn.

--save-init writes the initial parameters under minidl's names (conv1.weight, fc.bias, ...), and
--minidl-order shuffles every epoch with minidl's permutation for the same seed. Together they
make a matched pair: `minidl_example --seed S --init FILE` and `pytorch_reference.py --seed S
--save-init FILE --minidl-order` start from the same weights and train on the same batches, so
their losses and accuracies differ only by fp32 rounding (bench/compare-pytorch runs them so).
"""
import argparse
import gzip
import json
import os
import struct
import sys
import time

import numpy as np
import torch
from torch import nn

# Each example's defaults (examples/*.cpp).
SETTINGS = {
    "mnist_mlp": {"batch": 64, "lr": 0.01, "momentum": 0.0, "epochs": 20},
    "mnist_cnn": {"batch": 32, "lr": 0.01, "momentum": 0.0, "epochs": 5},
    "cifar_cnn": {"batch": 32, "lr": 0.01, "momentum": 0.9, "epochs": 10},
}


def read_maybe_gzip(path):
    for p in (path, path + ".gz"):
        if os.path.exists(p):
            with open(p, "rb") as f:
                data = f.read()
            return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
    sys.exit(f"pytorch_reference: missing {path}[.gz]")


def idx(path):
    data = read_maybe_gzip(path)
    magic, = struct.unpack(">I", data[:4])
    dims = struct.unpack(">" + "I" * (magic & 0xFF), data[4:4 + 4 * (magic & 0xFF)])
    return np.frombuffer(data, np.uint8, offset=4 + 4 * len(dims)).reshape(dims)


def load_mnist(d):
    def split(prefix):
        x = idx(f"{d}/{prefix}-images-idx3-ubyte").astype(np.float32)[:, None] / 255.0
        return x, idx(f"{d}/{prefix}-labels-idx1-ubyte").astype(np.int64)
    return split("train") + split("t10k")


def load_cifar(d):
    def batches(names):
        raw = np.concatenate([np.frombuffer(read_maybe_gzip(f"{d}/{n}.bin"), np.uint8)
                              .reshape(-1, 3073) for n in names])
        return raw[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0, raw[:, 0].astype(np.int64)
    return batches([f"data_batch_{i}" for i in range(1, 6)]) + batches(["test_batch"])


def standardize(xtr, xte):
    """Per channel, with the (possibly limited) training set's mean and standard deviation, as
    cifar_cnn does (statistics in double)."""
    mean = xtr.mean(axis=(0, 2, 3), keepdims=True, dtype=np.float64)
    std = np.sqrt(((xtr - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True))
    return ((xtr - mean) / std).astype(np.float32), ((xte - mean) / std).astype(np.float32)


# minidl's names for the weighted layers, in order (examples/*.cpp).
PARAMETER_NAMES = {
    "mnist_mlp": ["fc1", "fc2", "fc3"],
    "mnist_cnn": ["conv1", "fc"],
    "cifar_cnn": ["conv1", "conv2", "fc1", "fc2"],
}


def save_safetensors(path, tensors):
    """Writes {name: float32 tensor} in the safetensors format (header length, JSON, data)."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        blob = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    os.replace(path + ".tmp", path)


MASK64 = (1 << 64) - 1


def mix64(z):
    """SplitMix64's finaliser, as minidl/core/rng.hpp."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def minidl_permutation(n, seed):
    """minidl's permutation(n, seed): Fisher-Yates drawing from SplitMix64 with Lemire's
    unbiased bounded integers."""
    p = np.arange(n, dtype=np.int64)
    state = seed
    for i in range(n - 1, 0, -1):
        bound = i + 1
        while True:
            state = (state + 0x9E3779B97F4A7C15) & MASK64
            m = mix64(state) * bound
            if (m & MASK64) >= ((1 << 64) - bound) % bound:
                break
        j = m >> 64
        p[i], p[j] = p[j], p[i]
    return p


def minidl_epoch_order(n, seed, epoch):
    """The order minidl's Trainer::train_epoch shuffles epoch `epoch` (1-based) into."""
    return minidl_permutation(n, mix64((seed * 0x9E3779B97F4A7C15 + epoch) & MASK64))


def model(name):
    if name == "mnist_mlp":
        layers = [nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                  nn.Linear(128, 10)]
    elif name == "mnist_cnn":
        layers = [nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                  nn.Linear(8 * 13 * 13, 10)]
    else:
        layers = [nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                  nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                  nn.Linear(4096, 256), nn.ReLU(), nn.Linear(256, 10)]
    weighted = [m for m in layers if isinstance(m, (nn.Linear, nn.Conv2d))]
    for m in weighted[:-1]:
        nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
    nn.init.xavier_uniform_(weighted[-1].weight)
    for m in weighted:
        nn.init.zeros_(m.bias)
    return nn.Sequential(*layers)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", choices=sorted(SETTINGS))
    ap.add_argument("--data", required=True)
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--train-limit", type=int, default=0)
    ap.add_argument("--test-limit", type=int, default=0)
    ap.add_argument("--no-shuffle", action="store_true")
    ap.add_argument("--save-init")
    ap.add_argument("--minidl-order", action="store_true")
    a = ap.parse_args()
    s = SETTINGS[a.model]
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr, xte, yte = (load_cifar if a.model == "cifar_cnn" else load_mnist)(a.data)
    if a.train_limit:
        xtr, ytr = xtr[:a.train_limit], ytr[:a.train_limit]
    if a.test_limit:
        xte, yte = xte[:a.test_limit], yte[:a.test_limit]
    if a.model == "cifar_cnn":
        xtr, xte = standardize(xtr, xte)
    xtr, ytr, xte, yte = map(torch.from_numpy, (np.ascontiguousarray(xtr), ytr,
                                                 np.ascontiguousarray(xte), yte))
    net = model(a.model)
    if a.save_init:
        weighted = [m for m in net if isinstance(m, (nn.Linear, nn.Conv2d))]
        save_safetensors(a.save_init, {f"{n}.{p}": getattr(m, p) for n, m in
                                       zip(PARAMETER_NAMES[a.model], weighted)
                                       for p in ("weight", "bias")})
    opt = torch.optim.SGD(net.parameters(), lr=s["lr"], momentum=s["momentum"])
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(1, (a.epochs or s["epochs"]) + 1):
        net.train()
        if a.no_shuffle:
            order = torch.arange(len(xtr))
        elif a.minidl_order:
            order = torch.from_numpy(minidl_epoch_order(len(xtr), a.seed, epoch))
        else:
            order = torch.randperm(len(xtr))
        total, t0 = 0.0, time.perf_counter()
        for start in range(0, len(xtr), s["batch"]):
            idx_ = order[start:start + s["batch"]]
            x, y = xtr[idx_], ytr[idx_]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            total += loss.item() * len(idx_)
        seconds = time.perf_counter() - t0
        net.eval()
        with torch.no_grad():
            correct = sum(int((net(xte[i:i + 1000]).argmax(1) == yte[i:i + 1000]).sum())
                          for i in range(0, len(xte), 1000))
        print(json.dumps({"epoch": epoch, "epoch_seconds": seconds,
                          "train_loss": total / len(xtr), "test_accuracy": correct / len(xte)}),
              flush=True)


if __name__ == "__main__":
    main()
