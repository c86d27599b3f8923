"""A small CNN on scikit-learn's bundled 8x8 digits, exported to ONNX: the sample model of the
README and of quantcore's accuracy tests.

``build_digits(out_dir)`` writes

- ``model.onnx``: FP32, opset 17, input ``input`` (batch, 1, 8, 8) float32 in [0, 1], output ``logits``
  (batch, 10), dynamic batch axis. Conv→BatchNormalization→Relu blocks with a residual Add, MaxPool,
  Flatten and a Gemm head; the BatchNormalization nodes are kept (not fused by the exporter), so
  quantcore's BN folding is exercised.
- ``digits.npz``: ``input`` (1797, 1, 8, 8) float32 and ``labels`` (1797,) int64, all samples in an
  order shuffled by ``seed``. The model is trained on the first ``TRAIN_SAMPLES`` only; the remaining
  ``1797 - TRAIN_SAMPLES`` are held out (use them for evaluation, the first ones for calibration).
- ``heldout.npz``: only those held-out samples (``input``, ``labels``): the dataset to upload to the
  service, which splits one dataset into calibration and evaluation parts, so that no sample the
  model was trained on inflates the reported accuracy.

Training is deterministic for a given seed (one CPU thread, about 6 s).
Command line: ``python -m samples.digits OUT_DIR [--epochs N] [--seed S]``.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

TRAIN_SAMPLES = 1297  # of 1797; the last 500 of digits.npz are held out from training
OPSET = 17
HELDOUT_FILE = "heldout.npz"


class DigitsNet(nn.Module):
    """(B, 1, 8, 8) → (B, 10) logits."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()

        def block(c_in: int, c_out: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out))

        self.stem = block(1, width)  # (B, w, 8, 8)
        self.res_a = block(width, width)
        self.res_b = block(width, width)
        self.down = block(width, 2 * width)  # applied at 4x4
        self.head = nn.Linear(2 * width * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.stem(x))
        x = torch.relu(self.res_b(torch.relu(self.res_a(x))) + x)  # residual Add
        x = nn.functional.max_pool2d(x, 2)  # (B, w, 4, 4)
        x = nn.functional.max_pool2d(torch.relu(self.down(x)), 2)  # (B, 2w, 2, 2)
        return self.head(torch.flatten(x, 1))


def load_dataset(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """All 1797 digits in a seeded shuffled order: images (N, 1, 8, 8) float32 in [0, 1], labels (N,) int64."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(np.float32)[:, None, :, :]
    labels = digits.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    return images[order], labels[order]


def train(images: np.ndarray, labels: np.ndarray, *, epochs: int, seed: int) -> DigitsNet:
    """Adam with a cosine learning-rate schedule, batch 64, cross-entropy.

    Runs on one CPU thread: the results then don't depend on the machine's core count (float sums
    are ordered differently with more threads), and for a model this small one thread is also the
    fastest, since it never fights other processes for cores.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(images, labels, epochs=epochs, seed=seed)
    finally:
        torch.set_num_threads(threads)


def _train(images: np.ndarray, labels: np.ndarray, *, epochs: int, seed: int) -> DigitsNet:
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    model = DigitsNet()
    x = torch.from_numpy(images)
    y = torch.from_numpy(labels)
    batch = 64
    steps_per_epoch = -(-len(y) // batch)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * steps_per_epoch)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), batch):
            index = order[start : start + batch]
            loss = nn.functional.cross_entropy(model(x[index]), y[index])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    return model.eval()


def export_onnx(model: DigitsNet, path: Path) -> None:
    """TorchScript-based exporter in eval mode without constant folding, so BatchNormalization stays
    a node (the dynamo exporter's optimizer would fuse it into the Conv)."""
    example = torch.zeros(1, 1, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter warns that it is deprecated
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
            opset_version=OPSET,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.EVAL,
            dynamo=False,
        )


def build_digits(out_dir: Path, *, epochs: int = 30, seed: int = 0) -> tuple[Path, Path]:
    """Train, export and save; returns (model.onnx path, digits.npz path). See the module docstring."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    images, labels = load_dataset(seed)
    model = train(images[:TRAIN_SAMPLES], labels[:TRAIN_SAMPLES], epochs=epochs, seed=seed)
    model_path = out_dir / "model.onnx"
    data_path = out_dir / "digits.npz"
    export_onnx(model, model_path)
    np.savez(data_path, input=images, labels=labels)
    np.savez(out_dir / HELDOUT_FILE, input=images[TRAIN_SAMPLES:], labels=labels[TRAIN_SAMPLES:])
    return model_path, data_path


def held_out_accuracy(model: DigitsNet, images: np.ndarray, labels: np.ndarray) -> float:
    with torch.no_grad():
        predictions = model(torch.from_numpy(images[TRAIN_SAMPLES:])).argmax(dim=1).numpy()
    return float((predictions == labels[TRAIN_SAMPLES:]).mean())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train the digits sample CNN and export it to ONNX.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model_path, data_path = build_digits(args.out_dir, epochs=args.epochs, seed=args.seed)
    print(f"wrote {model_path} and {data_path}")


if __name__ == "__main__":
    main()
