"""Networks trained here on scikit-learn's bundled digits (1297 training samples, nothing downloaded),
exported to ONNX with their BatchNormalization kept: for tests and benchmarks that need real accuracy
beyond the sample CNN (``samples.digits``).

- ``build_resnet(dir, width=32)``: ``DigitsResNet``, a small ResNet (stem, two basic blocks at 8x8 with
  identity shortcuts, one at 4x4 with a strided 1x1 projection shortcut, global pooling, linear head);
- ``build_mobilenet(dir)``: ``DigitsMobileNet``, MobileNetV2's inverted residuals (1x1 expansion,
  depthwise 3x3, linear 1x1 projection) with ReLU6, which the exporter writes as Clip.

Training runs on one torch thread, whatever the caller's count, so it is deterministic for a given seed
and CPU (about 5 s each with oneDNN, measured). Before that was enforced, the narrow ResNet trained in the bench
(which sets one thread) and in a process left at two came out different models: W4A4 RTN top-1 93.8 % against
94.6 % on the same Xeon.
"""

from __future__ import annotations

import functools
import pickle
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from quantcore.runtime.threads import torch_threads
from samples.digits import TRAIN_SAMPLES, load_dataset


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut = (
            nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))
            if stride != 1 or c_in != c_out
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


class DigitsResNet(nn.Module):
    """(B, 1, 8, 8) → (B, 10)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.layers = nn.Sequential(
            BasicBlock(width, width, 1), BasicBlock(width, width, 1), BasicBlock(width, 2 * width, 2)
        )
        self.head = nn.Linear(2 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.layers(self.stem(x)).mean(dim=(2, 3)))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion, 3x3 depthwise, 1x1 linear projection; identity shortcut when
    the shape allows."""

    def __init__(self, c_in: int, c_out: int, stride: int, expansion: int) -> None:
        super().__init__()
        hidden = c_in * expansion
        self.body = nn.Sequential(
            nn.Conv2d(c_in, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(),
            nn.Conv2d(hidden, c_out, 1, bias=False),
            nn.BatchNorm2d(c_out),
        )
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class DigitsMobileNet(nn.Module):
    """(B, 1, 8, 8) → (B, 10): stem, four inverted residuals (expansion 4; two at 8x8 with identity
    shortcuts, a strided one to 4x4, one more with its shortcut), 1x1 head conv, global pooling, linear."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU6())
        self.layers = nn.Sequential(
            InvertedResidual(width, width, 1, 4),
            InvertedResidual(width, width, 1, 4),
            InvertedResidual(width, 2 * width, 2, 4),
            InvertedResidual(2 * width, 2 * width, 1, 4),
        )
        self.features = nn.Sequential(
            nn.Conv2d(2 * width, 4 * width, 1, bias=False), nn.BatchNorm2d(4 * width), nn.ReLU6()
        )
        self.head = nn.Linear(4 * width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(self.layers(self.stem(x))).mean(dim=(2, 3)))


def build_resnet(out_dir: Path, *, width: int = 32) -> Path:
    return train_and_export(functools.partial(DigitsResNet, width), Path(out_dir) / f"resnet-{width}.onnx")


def build_mobilenet(out_dir: Path) -> Path:
    return train_and_export(DigitsMobileNet, Path(out_dir) / "mobilenet.onnx")


def train_and_export(make: Callable[[], nn.Module], path: Path, *, epochs: int = 15, seed: int = 0) -> Path:
    """Train ``make()`` (built after seeding torch; picklable) on the digits training split (SGD, momentum
    0.9, cosine schedule, batch 64) and export it to ONNX (BN kept) at ``path``.

    oneDNN's convolution backward aborts the process (a double free) on some AVX2-only CPUs, for some
    networks only, while the native kernels train depthwise convolutions about 5x slower. So training
    runs first with oneDNN in a child process, and only where that child dies, here with oneDNN off."""
    child = subprocess.run(
        [sys.executable, "-c", CHILD],
        input=pickle.dumps((make, Path(path), epochs, seed)),
        cwd=Path(__file__).resolve().parents[1],
        check=False,
    )
    if child.returncode != 0:
        with torch.backends.mkldnn.flags(enabled=False):
            _train_and_export(make, path, epochs, seed)
    return path


# the child: ``_train_and_export`` on the pickled arguments ``train_and_export`` writes to its stdin
CHILD = "import pickle, sys\nfrom samples.trained import _train_and_export as run\nrun(*pickle.load(sys.stdin.buffer))"


def _train_and_export(make: Callable[[], nn.Module], path: Path, epochs: int, seed: int) -> None:
    # float sums in one order: the same model whatever the machine's cores
    with torch_threads(1):
        model = _train(make, seed=seed, epochs=epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (torch.zeros(1, 1, 8, 8),),
            str(path),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=17,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.EVAL,
            dynamo=False,
        )


def _train(make: Callable[[], nn.Module], *, seed: int, epochs: int) -> nn.Module:
    images, labels = load_dataset(seed)
    torch.manual_seed(seed)
    model = make()
    x, y = torch.from_numpy(images[:TRAIN_SAMPLES]), torch.from_numpy(labels[:TRAIN_SAMPLES])
    steps = epochs * -(-len(y) // 64)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    generator = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), 64):
            index = order[start : start + 64]
            loss = nn.functional.cross_entropy(model(x[index]), y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    model.eval()
    return model
