#!/usr/bin/python3
"""The reference models in PyTorch, trained like minidl's examples: the same data files, model
shapes, initialisation (He normal for layers followed by ReLU, Xavier uniform for the output
layer, zero biases; BatchNorm's weight 1 and bias 0), optimiser, learning-rate schedule, batch
sizes, epochs and data augmentation. Prints one JSON
line per epoch: {"epoch", "epoch_seconds", "train_loss", "test_loss", "test_accuracy", "lr",
"grad_norm"}, where epoch_seconds is the wall time of the epoch's training steps with their batch
gathering (evaluation excluded), as minidl's metrics define it; test_accuracy is left out for the
autoencoder, lr is the learning rate of the epoch's last step, and grad_norm (only with
--clip-grad-norm) that step's total gradient norm before clipping.

usage: pytorch_reference.py MODEL --data DIR [--epochs N] [--threads T] [--seed S]
                            [--train-limit N] [--test-limit N] [--no-shuffle]
                            [--save-init FILE.safetensors] [--save FILE.safetensors]
                            [--minidl-order] [--max-steps N]
                            [--optimizer sgd|adamw] [--lr X] [--momentum X] [--nesterov]
                            [--weight-decay X] [--beta1 X] [--beta2 X] [--eps X]
                            [--lr-schedule constant|step|cosine] [--lr-step-epochs N]
                            [--lr-gamma X] [--warmup-steps W] [--clip-grad-norm X]
                            [--augment crop,flip|none] [--float64]
MODEL: mnist_mlp, mnist_cnn, cifar_cnn, cifar_resnet, cifar_bn_cnn (softmax cross-entropy) or
mnist_autoencoder
(784-128-32-128-784 with a sigmoid output; mean squared error against the input pixels in
[0, 1]).

cifar_resnet is ResNet-20 for CIFAR-10 (He et al. 2016, section 4.2) as examples/cifar_resnet.cpp
builds it: conv 3x3 16 -> BN -> ReLU, three stages of three basic blocks (16, 32, 64 channels;
stride 2 in the first block of stages 2 and 3), each conv 3x3 -> BN -> ReLU -> conv 3x3 -> BN,
plus the shortcut, -> ReLU; the shortcut is the identity, or where the shape changes a 1x1
convolution with stride 2 and BN (option B); global average pooling, linear 64 -> 10.
Convolutions have no bias. Its state_dict names (conv1, bn1, layer1.0.conv1, layer2.0.shortcut.0,
..., fc) are minidl's.

cifar_bn_cnn is examples/cifar_bn_cnn.cpp's small BatchNorm CNN: conv 3x3 32 -> BN -> ReLU ->
max-pool 2, conv 3x3 64 -> BN -> ReLU -> max-pool 2, global average pooling, linear 64 -> 10;
its state_dict names (conv1, bn1, conv2, bn2, fc) are minidl's too.

Training (the flags of minidl's examples, with their semantics and defaults; a flag left out
takes the model's default from SETTINGS, else the one below):
- --optimizer sgd (default): torch.optim.SGD(lr, momentum, nesterov, weight_decay), PyTorch's
  coupled weight decay (the gradient plus weight_decay x parameter). --optimizer adamw:
  torch.optim.AdamW(lr, betas=(--beta1 0.9, --beta2 0.999), --eps 1e-8, weight_decay).
  Both on the single-tensor path (foreach=False). --weight-decay defaults to 0; --momentum and
  --nesterov apply to SGD only, --beta1, --beta2 and --eps to AdamW only.
- The learning rate of optimizer step t (0, 1, 2, ... over the whole run, one per batch) is
  lr * (warm(t) * decay(t)), in double, with warm(t) = min(1, (t + 1) / W) (1 when
  --warmup-steps W is 0) and decay(t): constant (default) 1; step gamma ** floor(t / (N * S));
  cosine 0.5 * (1 + cos(pi * min(1, max(0, t - W) / max(1, T - W)))), where N is
  --lr-step-epochs (1), gamma --lr-gamma (0.1), S = ceil(training samples / batch) the steps
  per epoch and T = epochs * S. A LambdaLR, stepped after every optimizer step.
- --clip-grad-norm X (0: off) clips the gradients to a total 2-norm of X between backward and
  the optimizer step (torch.nn.utils.clip_grad_norm_).
- --max-steps N (0: no limit) stops after N optimizer steps, the schedule unchanged: the epoch
  in progress is evaluated and reported over the samples it trained on, and the run ends.
- --augment crop,flip (cifar_resnet's default; `none` or "" for none) draws each training
  batch anew, after standardisation: crop takes a 32x32 window at a uniformly random offset from
  the image padded by 4 zeros on every side (0 is the mean after standardisation), flip mirrors
  the image left-right with probability 1/2. The draws come from a torch.Generator seeded with
  --seed, so a run repeats, but they are not minidl's draws: augmented runs of the two frameworks
  are alike in distribution, not batch for batch.

--save-init writes the initial parameters under minidl's names (conv1.weight, fc.bias, ...),
and BatchNorm's buffers (running_mean, running_var, num_batches_tracked as int64), --save the
trained ones, and --minidl-order shuffles every epoch with minidl's permutation for
the same seed. Together they make a matched pair: `minidl_example --seed S --init FILE` and
`pytorch_reference.py --seed S --save-init FILE --minidl-order` start from the same weights and
train on the same batches, so their losses and accuracies differ only by fp32 rounding
(bench/compare-pytorch runs them so, and compares ten steps' parameters through --save).
--float64 trains in double precision from the same float32 initial weights (saved as float32):
the nearly rounding-free run that float32 runs of both frameworks are measured against.
--autocast-bf16 runs the forward (training and evaluation) under PyTorch's CPU autocast to
bfloat16 (its convolutions and linear layers on bf16 factors through oneDNN, the parameters,
their gradients and the optimizer in float32) and the loss in float32 on the output: the
reference for minidl's --precision bf16.
"""
import argparse
import gzip
import inspect
import json
import math
import os
import struct
import sys
import time

import numpy as np
import torch
from torch import nn

# Each example's defaults (examples/*.cpp); TRAINING_DEFAULTS for the flags a model leaves out.
SETTINGS = {
    "mnist_mlp": {"batch": 64, "lr": 0.01, "momentum": 0.0, "epochs": 20},
    "mnist_cnn": {"batch": 32, "lr": 0.01, "momentum": 0.0, "epochs": 5},
    "cifar_cnn": {"batch": 32, "lr": 0.01, "momentum": 0.9, "epochs": 10},
    "mnist_autoencoder": {"batch": 64, "lr": 0.001, "momentum": 0.0, "epochs": 5,
                          "optimizer": "adamw", "weight_decay": 0.0, "lr_schedule": "cosine",
                          "warmup_steps": 0},
    "cifar_resnet": {"batch": 128, "lr": 0.1, "momentum": 0.9, "epochs": 15, "nesterov": True,
                     "weight_decay": 5e-4, "lr_schedule": "cosine", "warmup_steps": 391,
                     "augment": "crop,flip"},
    "cifar_bn_cnn": {"batch": 32, "lr": 0.01, "momentum": 0.9, "epochs": 10},
}
TRAINING_DEFAULTS = {"optimizer": "sgd", "nesterov": False, "weight_decay": 0.0,
                     "lr_schedule": "constant", "warmup_steps": 0, "augment": "none"}
CIFAR_MODELS = ("cifar_cnn", "cifar_resnet", "cifar_bn_cnn")
# The models whose state_dict has minidl's names (BatchNorm's buffers included).
STATE_DICT_MODELS = ("cifar_resnet", "cifar_bn_cnn")


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
    "mnist_autoencoder": ["fc1", "fc2", "fc3", "fc4"],
}


def named_parameters(net, name):
    """The model's state under minidl's names: for cifar_resnet and cifar_bn_cnn its state_dict,
    whose names are minidl's already (BatchNorm's buffers included); for the others the
    parameters, in minidl's order."""
    if name in STATE_DICT_MODELS:
        return net.state_dict()
    weighted = [m for m in net if isinstance(m, (nn.Linear, nn.Conv2d))]
    return {f"{n}.{p}": getattr(m, p) for n, m in zip(PARAMETER_NAMES[name], weighted)
            for p in ("weight", "bias")}


def save_safetensors(path, tensors):
    """Writes {name: tensor} in the safetensors format (header length, JSON, data): integer
    tensors (BatchNorm's num_batches_tracked) as I64, every other one as F32."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        integer = not t.is_floating_point()
        blob = t.detach().contiguous().numpy().astype("<i8" if integer else "<f4").tobytes()
        header[name] = {"dtype": "I64" if integer else "F32", "shape": list(t.shape),
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


class BasicBlock(nn.Module):
    """ResNet's basic block with option B shortcuts: relu(bn2(conv2(relu(bn1(conv1(x))))) +
    shortcut(x)), the shortcut a 1x1 convolution with the block's stride and BN where the shape
    changes, else the identity (an empty Sequential, as minidl's block without a shortcut)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.shortcut(x))


class ResNet20(nn.Module):
    """ResNet-20 for CIFAR-10 (n = 3 blocks per stage), examples/cifar_resnet.cpp's model."""

    def __init__(self, blocks=3, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        cin, stages = 16, []
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            layer = []
            for b in range(blocks):
                layer.append(BasicBlock(cin, cout, stride if b == 0 else 1))
                cin = cout
            stages.append(nn.Sequential(*layer))
        self.layer1, self.layer2, self.layer3 = stages
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, classes)
        # minidl's initialisation: He normal (fan_in) for every convolution, Xavier uniform for
        # the output layer, zero biases; BatchNorm weight 1 and bias 0 (PyTorch's own).
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class BatchNormCNN(nn.Module):
    """examples/cifar_bn_cnn.cpp's model: conv 3x3 32 -> BN -> ReLU -> max-pool 2, conv 3x3 64 ->
    BN -> ReLU -> max-pool 2, global average pooling, linear 64 -> 10."""

    def __init__(self, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64, classes)
        for conv in (self.conv1, self.conv2):
            nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="relu")
        nn.init.xavier_uniform_(self.fc.weight)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def model(name):
    if name == "cifar_resnet":
        return ResNet20()
    if name == "cifar_bn_cnn":
        return BatchNormCNN()
    if name == "mnist_mlp":
        layers = [nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                  nn.Linear(128, 10)]
    elif name == "mnist_cnn":
        layers = [nn.Conv2d(1, 8, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                  nn.Linear(8 * 13 * 13, 10)]
    elif name == "mnist_autoencoder":
        layers = [nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 32), nn.ReLU(),
                  nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 784), nn.Sigmoid()]
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


def parse_augment(text):
    """The set of --augment's transforms: a comma-separated subset of crop and flip; "" or none:
    none."""
    if text in ("", "none"):
        return set()
    names = text.split(",")
    bad = [n for n in names if n not in ("crop", "flip")]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"--augment takes crop, flip (comma-separated) or none, got '{text}'")
    return set(names)


def augment(x, transforms, generator, pad=4):
    """A batch x [N, C, H, W] (standardised) with each image randomly cropped from its zero-padded
    copy and/or mirrored left-right, all on tensors: per image two offsets in [0, 2 pad] and one
    coin, drawn from generator in that order."""
    n, c, h, w = x.shape
    if "crop" in transforms:
        offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=generator)
        padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
        rows = (offsets[:, 0:1] + torch.arange(h))[:, None, :, None]
        cols = (offsets[:, 1:2] + torch.arange(w))[:, None, None, :]
        x = padded[torch.arange(n)[:, None, None, None], torch.arange(c)[None, :, None, None],
                   rows, cols]
    if "flip" in transforms:
        flip = torch.rand(n, generator=generator) < 0.5
        x = torch.where(flip[:, None, None, None], x.flip(3), x)
    return x


def lr_factor(t, schedule, warmup, step_epochs, gamma, steps_per_epoch, total_steps):
    """The factor on the base learning rate for optimizer step t (0-based over the whole run),
    in double: warm(t) * decay(t), as minidl's schedule computes it."""
    warm = 1.0 if warmup == 0 else min(1.0, (t + 1) / warmup)
    if schedule == "step":
        decay = gamma ** (t // (step_epochs * steps_per_epoch))
    elif schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0, t - warmup) /
                                                      max(1, total_steps - warmup))))
    else:
        decay = 1.0
    return warm * decay


def clip_grad_norm(params, max_norm):
    """clip_grad_norm_ on the per-tensor path (foreach=False where PyTorch offers the choice;
    1.13 has only that path). Returns the total norm before clipping."""
    clip = torch.nn.utils.clip_grad_norm_
    if "foreach" in inspect.signature(clip).parameters:
        return clip(params, max_norm, foreach=False)
    return clip(params, max_norm)


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
    ap.add_argument("--save")
    ap.add_argument("--minidl-order", action="store_true")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--optimizer", choices=("sgd", "adamw"))
    ap.add_argument("--lr", type=float)
    ap.add_argument("--momentum", type=float)
    ap.add_argument("--nesterov", action="store_true", default=None)
    ap.add_argument("--weight-decay", type=float)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.999)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--lr-schedule", choices=("constant", "step", "cosine"))
    ap.add_argument("--lr-step-epochs", type=int, default=1)
    ap.add_argument("--lr-gamma", type=float, default=0.1)
    ap.add_argument("--warmup-steps", type=int)
    ap.add_argument("--clip-grad-norm", type=float, default=0.0)
    ap.add_argument("--augment", help="crop,flip, a part of it, or none")
    ap.add_argument("--autocast-bf16", action="store_true",
                    help="forward under CPU autocast to bfloat16, the loss in float32")
    ap.add_argument("--float64", action="store_true",
                    help="train in double precision (from the same float32 initial weights): "
                         "the rounding-free reference the float32 runs are measured against")
    a = ap.parse_args()
    s = SETTINGS[a.model]
    for key, default in TRAINING_DEFAULTS.items():
        if getattr(a, key) is None:
            setattr(a, key, s.get(key, default))
    for key in ("lr", "momentum", "epochs"):
        if getattr(a, key) is None:
            setattr(a, key, s[key])
    if not a.lr > 0:
        ap.error(f"--lr must be positive, got {a.lr}")
    if not 0 <= a.momentum < 1:
        ap.error(f"--momentum must be in [0, 1), got {a.momentum}")
    if a.nesterov and a.optimizer == "sgd" and a.momentum == 0:
        ap.error("--nesterov needs a --momentum above 0")
    if not a.weight_decay >= 0:
        ap.error(f"--weight-decay must be >= 0, got {a.weight_decay}")
    if not (0 <= a.beta1 < 1 and 0 <= a.beta2 < 1 and a.eps >= 0):
        ap.error("--beta1 and --beta2 must be in [0, 1), --eps >= 0")
    if a.epochs < 1 or a.lr_step_epochs < 1 or a.warmup_steps < 0 or a.max_steps < 0:
        ap.error("--epochs and --lr-step-epochs must be >= 1, --warmup-steps and --max-steps >= 0")
    if not a.clip_grad_norm >= 0:
        ap.error(f"--clip-grad-norm must be >= 0 (0: off), got {a.clip_grad_norm}")
    try:
        transforms = parse_augment(a.augment)
    except ValueError as e:
        ap.error(str(e))
    if transforms and a.model not in CIFAR_MODELS:
        ap.error(f"--augment is for the CIFAR-10 models, not {a.model}")
    if a.autocast_bf16 and a.float64:
        ap.error("--autocast-bf16 and --float64 exclude each other")
    autoencoder = a.model == "mnist_autoencoder"
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    xtr, ytr, xte, yte = (load_cifar if a.model in CIFAR_MODELS else load_mnist)(a.data)
    if a.train_limit:
        xtr, ytr = xtr[:a.train_limit], ytr[:a.train_limit]
    if a.test_limit:
        xte, yte = xte[:a.test_limit], yte[:a.test_limit]
    if a.model in CIFAR_MODELS:
        xtr, xte = standardize(xtr, xte)
    xtr, ytr, xte, yte = map(torch.from_numpy, (np.ascontiguousarray(xtr), ytr,
                                                 np.ascontiguousarray(xte), yte))
    if autoencoder:  # the target is the input image, flattened
        ytr, yte = xtr.reshape(len(xtr), -1), xte.reshape(len(xte), -1)
    net = model(a.model)

    def forward(x):
        """The model's output: under autocast to bfloat16 with --autocast-bf16 (returned as
        float32, for a float32 loss), else in the parameters' type."""
        if not a.autocast_bf16:
            return net(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return net(x).float()
    if a.save_init:
        save_safetensors(a.save_init, named_parameters(net, a.model))
    if a.float64:
        net = net.double()
        xtr, xte = xtr.double(), xte.double()
        if autoencoder:
            ytr, yte = ytr.double(), yte.double()
    if a.optimizer == "adamw":
        opt = torch.optim.AdamW(net.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), eps=a.eps,
                                weight_decay=a.weight_decay, foreach=False)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum,
                              nesterov=a.nesterov, weight_decay=a.weight_decay, foreach=False)
    batch = s["batch"]
    steps_per_epoch = -(-len(xtr) // batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda t: lr_factor(t, a.lr_schedule, a.warmup_steps, a.lr_step_epochs, a.lr_gamma,
                                 steps_per_epoch, a.epochs * steps_per_epoch))
    loss_fn = nn.MSELoss() if autoencoder else nn.CrossEntropyLoss()
    test_loss_fn = (nn.MSELoss(reduction="sum") if autoencoder
                    else nn.CrossEntropyLoss(reduction="sum"))
    draws = torch.Generator().manual_seed(a.seed)  # --augment's crops and flips
    step = 0
    for epoch in range(1, a.epochs + 1):
        net.train()
        if a.no_shuffle:
            order = torch.arange(len(xtr))
        elif a.minidl_order:
            order = torch.from_numpy(minidl_epoch_order(len(xtr), a.seed, epoch))
        else:
            order = torch.randperm(len(xtr))
        total, seen, t0 = 0.0, 0, time.perf_counter()
        for start in range(0, len(xtr), batch):
            if a.max_steps and step == a.max_steps:
                break
            idx_ = order[start:start + batch]
            x, y = xtr[idx_], ytr[idx_]
            if transforms:
                x = augment(x, transforms, draws)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(forward(x), y)
            loss.backward()
            if a.clip_grad_norm:
                grad_norm = float(clip_grad_norm(net.parameters(), a.clip_grad_norm))
            lr = opt.param_groups[0]["lr"]
            opt.step()
            schedule.step()
            step += 1
            total += loss.item() * len(idx_)
            seen += len(idx_)
        seconds = time.perf_counter() - t0
        net.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(xte), 1000):
                out = forward(xte[i:i + 1000])
                test_loss += test_loss_fn(out, yte[i:i + 1000]).item()
                if not autoencoder:
                    correct += int((out.argmax(1) == yte[i:i + 1000]).sum())
        # Per sample for cross-entropy, per element (pixel) for the autoencoder's MSE.
        record = {"epoch": epoch, "epoch_seconds": seconds, "train_loss": total / seen,
                  "test_loss": test_loss / yte.numel()}
        if not autoencoder:
            record["test_accuracy"] = correct / len(xte)
        record["lr"] = lr
        if a.clip_grad_norm:
            record["grad_norm"] = grad_norm
        print(json.dumps(record), flush=True)
        if a.max_steps and step >= a.max_steps:
            break
    if a.save:
        save_safetensors(a.save, named_parameters(net, a.model))


if __name__ == "__main__":
    main()
