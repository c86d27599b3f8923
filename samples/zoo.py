"""The model zoo: tiny networks in the shapes real models come in, built in torch and exported to ONNX
(no downloads; random weights; each a few KB so the whole zoo quantizes in seconds on 2 cores).

``build(name)`` returns a ``ZooModel``: the ONNX model plus sample inputs (first axis samples);
``build(name, "dynamo")`` the same network as torch's default exporter writes it (``EXPORTED`` only). Names:

- ``resnet``: Conv+BN+Relu stem, two residual blocks (Add joins, a strided 1x1 projection), GAP, Gemm.
- ``mobilenet``: MobileNetV2 inverted residuals: 1x1 expand, depthwise 3x3 (group = channels),
  1x1 project, residual Add; hard-swish activations.
- ``unet``: encoder conv, strided down conv, ConvTranspose up, Resize (nearest, x2), Concat skip;
  dynamic batch, height and width (symbolic dimensions beyond batch).
- ``detector``: conv backbone and a YOLO-style head: Reshape to (N, A, 5 + C, HW), Transpose,
  Split into xy / wh / objectness / classes, Sigmoid, Concat.
- ``transformer``: token Embedding and position Embedding (Gather), one encoder layer (q/k/v MatMul,
  scaled Softmax attention, LayerNormalization, Gelu written with Erf, a LayerNorm decomposed into
  ReduceMean/Sub/Pow/Sqrt/Div); int64 tokens with dynamic batch and sequence axes.
- ``audio``: 1-D conv net over raw audio (Conv1d with BN, depthwise Conv1d, GAP, Gemm); dynamic
  batch and time.
- ``legacy``: a CNN with BatchNormalization exported at opset 11 (prepare upgrades it to 13).
- ``branchy``: an ``If`` on a constant condition (built with onnx.helper: torch does not emit one),
  whose taken branch holds a Conv with a branch-local weight and reads outer-scope tensors.

The trained digits CNN (``samples/digits.py``) completes the zoo through the ``digits_sample`` fixture.
"""

from __future__ import annotations

import functools
import io
import warnings
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn
from torch.nn import functional as F

SAMPLES = 24  # per model: 16 calibrate, 8 evaluate
OPSET = 17


@dataclass(frozen=True)
class ZooModel:
    name: str
    model: onnx.ModelProto
    inputs: dict[str, np.ndarray]  # first axis samples
    labels: np.ndarray | None = None
    # input name -> one extra batch with other sizes on the dynamic axes (checks they stay dynamic)
    resized: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def calibration(self) -> dict[str, np.ndarray]:
        return {k: v[:16] for k, v in self.inputs.items()}

    @property
    def evaluation(self) -> dict[str, np.ndarray]:
        return {k: v[16:] for k, v in self.inputs.items()}


def export(
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    input_names: list[str],
    output_names: list[str],
    dynamic_axes: dict[str, dict[int, str]],
    opset: int = OPSET,
    *,
    exporter: str = "torchscript",
) -> onnx.ModelProto:
    """Export in eval mode. ``torchscript``: the legacy exporter, BatchNormalization kept as nodes (as in
    samples/digits.py); ``dynamo``: ``torch.onnx.export``'s default since PyTorch 2.9 (torch.export, opset
    18 at least, its optimizer folds BatchNormalization into the convs), as most users' models now come."""
    module.eval()
    if exporter == "dynamo":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(
                module,
                example,
                input_names=input_names,
                output_names=output_names,
                dynamic_axes=dynamic_axes,
                opset_version=max(opset, 18),
                dynamo=True,
                verbose=False,
            )
        return program.model_proto
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter warns that it is deprecated
        torch.onnx.export(
            module,
            example,
            buffer,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.EVAL,
            dynamo=False,
        )
    model = onnx.load_from_string(buffer.getvalue())
    model.ir_version = min(model.ir_version, 10)
    return model


def _images(rng: np.random.Generator, n: int, c: int, h: int, w: int) -> np.ndarray:
    return rng.normal(0.0, 1.0, (n, c, h, w)).astype(np.float32)


def _randomize_batchnorm(module: nn.Module, seed: int) -> nn.Module:
    """Non-trivial running statistics, so BN folding is exercised with real numbers."""
    generator = torch.Generator().manual_seed(seed)
    for layer in module.modules():
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            c = layer.num_features
            layer.running_mean.copy_(torch.randn(c, generator=generator) * 0.2)
            layer.running_var.copy_(torch.rand(c, generator=generator) + 0.5)
            layer.weight.data.copy_(torch.rand(c, generator=generator) + 0.5)
            layer.bias.data.copy_(torch.randn(c, generator=generator) * 0.1)
    return module


def _conv_bn(c_in: int, c_out: int, k: int = 3, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(c_out))


class ResNetish(nn.Module):
    """(N, 3, 16, 16) → (N, 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 8)
        self.a1, self.a2 = _conv_bn(8, 8), _conv_bn(8, 8)
        self.b1, self.b2 = _conv_bn(8, 16, stride=2), _conv_bn(16, 16)
        self.project = _conv_bn(8, 16, k=1, stride=2)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        x = F.relu(self.a2(F.relu(self.a1(x))) + x)  # identity residual
        x = F.relu(self.b2(F.relu(self.b1(x))) + self.project(x))  # projected residual
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, channels: int, expand: int) -> None:
        super().__init__()
        hidden = channels * expand
        self.expand = _conv_bn(channels, hidden, k=1)
        self.depthwise = _conv_bn(hidden, hidden, k=3, groups=hidden)
        self.project = _conv_bn(hidden, channels, k=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.depthwise(F.hardswish(self.expand(x))))
        return x + self.project(y)


class MobileNetish(nn.Module):
    """(N, 3, 16, 16) → (N, 10)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = _conv_bn(3, 8, stride=2)
        self.blocks = nn.Sequential(InvertedResidual(8, 2), InvertedResidual(8, 3))
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.hardswish(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class UNetish(nn.Module):
    """(N, 3, H, W) → (N, 2, H, W), H and W even."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Conv2d(3, 8, 3, padding=1)
        self.down = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.side = nn.Conv2d(16, 4, 1)
        self.out = nn.Conv2d(8 + 8 + 4, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skip = F.relu(self.enc(x))  # (N, 8, H, W)
        bottom = F.relu(self.down(skip))  # (N, 16, H/2, W/2)
        resized = F.interpolate(self.side(bottom), scale_factor=2.0, mode="nearest")  # (N, 4, H, W)
        return self.out(torch.cat([skip, F.relu(self.up(bottom)), resized], dim=1))


class DetectorHead(nn.Module):
    """(N, 3, 16, 16) → (N, A·HW, 5 + C) boxes: sigmoid xy, raw wh, sigmoid objectness and classes."""

    anchors, classes = 2, 3

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(_conv_bn(3, 8, stride=2), nn.ReLU(), _conv_bn(8, 16, stride=2), nn.ReLU())
        self.head = nn.Conv2d(16, self.anchors * (5 + self.classes), 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.head(self.backbone(x))  # (N, A·(5+C), 4, 4)
        n = y.shape[0]
        y = y.reshape(n, self.anchors, 5 + self.classes, -1).permute(0, 1, 3, 2)  # (N, A, HW, 5+C)
        xy, wh, objectness, classes = torch.split(y, [2, 2, 1, self.classes], dim=-1)
        boxes = torch.cat([torch.sigmoid(xy), wh, torch.sigmoid(objectness), torch.sigmoid(classes)], dim=-1)
        return boxes.reshape(n, -1, 5 + self.classes)


class DecomposedLayerNorm(nn.Module):
    """LayerNorm in elementary ops, as exporters without LayerNormalization emit it."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.rand(d) + 0.5)
        self.beta = nn.Parameter(torch.randn(d) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(-1, keepdim=True)
        d = x - mean
        variance = d.pow(2).mean(-1, keepdim=True)
        return d / torch.sqrt(variance + 1e-5) * self.gamma + self.beta


class TinyEncoder(nn.Module):
    """tokens (N, T) int64 → (N, T, 4)."""

    vocab, d, max_len = 50, 16, 32

    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(self.vocab, self.d)
        self.positions = nn.Embedding(self.max_len, self.d)
        self.q, self.k, self.v, self.o = (nn.Linear(self.d, self.d) for _ in range(4))
        self.norm1 = nn.LayerNorm(self.d)
        self.ff1, self.ff2 = nn.Linear(self.d, 2 * self.d), nn.Linear(2 * self.d, self.d)
        self.norm2 = DecomposedLayerNorm(self.d)
        self.head = nn.Linear(self.d, 4)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        positions = torch.arange(t, device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)  # (N, T, d)
        scores = self.q(x) @ self.k(x).transpose(1, 2) / self.d**0.5  # (N, T, T)
        x = self.norm1(x + self.o(torch.softmax(scores, dim=-1) @ self.v(x)))
        x = self.norm2(x + self.ff2(F.gelu(self.ff1(x))))  # exact gelu: Erf
        return self.head(x)


class AudioNet(nn.Module):
    """audio (N, 1, L) → (N, 5)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Sequential(nn.Conv1d(1, 8, 9, stride=4, padding=4), nn.BatchNorm1d(8), nn.ReLU())
        self.c2 = nn.Sequential(nn.Conv1d(8, 16, 5, stride=2, padding=2), nn.ReLU())
        self.dw = nn.Conv1d(16, 16, 3, padding=1, groups=16)
        self.fc = nn.Linear(16, 5)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        x = self.c2(self.c1(audio))
        x = F.relu(self.dw(x)) + x
        return self.fc(x.mean(-1))


class LegacyCNN(nn.Module):
    """(N, 1, 12, 12) → (N, 4), exported at opset 11."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = _conv_bn(1, 8), _conv_bn(8, 8, stride=2)
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(F.relu(self.c2(F.relu(self.c1(x)))), 1))


def _vision(name: str, network: type[nn.Module], seed: int, shape: tuple[int, int, int], exporter: str) -> ZooModel:
    torch.manual_seed(seed)  # before construction: the weights are drawn in __init__
    module = _randomize_batchnorm(network(), seed)
    rng = np.random.default_rng(seed)
    images = _images(rng, SAMPLES, *shape)
    axes = {"input": {0: "N"}, "output": {0: "N"}}
    model = export(module, (torch.from_numpy(images[:2]),), ["input"], ["output"], axes, exporter=exporter)
    return ZooModel(name, model, {"input": images})


def branchy(seed: int = 0) -> ZooModel:
    """input (N, 4, 8, 8) → Conv → If(constant True) {then: Relu → Conv (branch weight) + outer
    tensor; else: Sigmoid} → GlobalAveragePool → Flatten → Gemm → output (N, 3)."""
    rng = np.random.default_rng(seed)

    def init(name: str, shape: tuple[int, ...], std: float = 0.3) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, std, shape).astype(np.float32), name)

    then_branch = helper.make_graph(
        [
            helper.make_node("Relu", ["features"], ["relu"], name="then_relu"),
            helper.make_node("Conv", ["relu", "branch_w", "branch_b"], ["branch_conv"], name="then_conv", pads=[1] * 4),
            helper.make_node("Add", ["branch_conv", "features"], ["then_out"], name="then_add"),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)],
        [init("branch_w", (8, 8, 3, 3)), init("branch_b", (8,), 0.1)],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Sigmoid", ["features"], ["else_out"], name="else_sigmoid")],
        "else",
        [],
        [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)],
    )
    nodes = [
        helper.make_node("Conv", ["input", "stem_w", "stem_b"], ["features"], name="stem", pads=[1] * 4),
        helper.make_node(
            "If", ["use_residual"], ["mixed"], name="branch", then_branch=then_branch, else_branch=else_branch
        ),
        helper.make_node("GlobalAveragePool", ["mixed"], ["pooled"], name="gap"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["output"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "branchy",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3])],
        [
            init("stem_w", (8, 4, 3, 3)),
            init("stem_b", (8,), 0.1),
            numpy_helper.from_array(np.array(True), "use_residual"),
            init("fc_w", (3, 8)),
            init("fc_b", (3,), 0.1),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tests")
    model.ir_version = 10
    return ZooModel("branchy", model, {"input": _images(rng, SAMPLES, 4, 8, 8)})


@functools.cache
def build(name: str, exporter: str = "torchscript") -> ZooModel:
    """The zoo model ``name`` (cached: built once per test session); those in ``EXPORTED`` as the torch
    ``exporter`` writes them (``export``)."""
    if exporter != "torchscript" and name not in EXPORTED:
        raise KeyError(f"zoo model {name!r} is not exported from torch")
    if name == "resnet":
        return _vision(name, ResNetish, 1, (3, 16, 16), exporter)
    if name == "mobilenet":
        return _vision(name, MobileNetish, 2, (3, 16, 16), exporter)
    if name == "detector":
        return _vision(name, DetectorHead, 3, (3, 16, 16), exporter)
    if name == "unet":
        torch.manual_seed(4)
        images = _images(np.random.default_rng(4), SAMPLES, 3, 16, 16)
        axes = {0: "N", 2: "H", 3: "W"}
        model = export(
            UNetish(),
            (torch.from_numpy(images[:2]),),
            ["input"],
            ["output"],
            {"input": axes, "output": axes},
            exporter=exporter,
        )
        resized = {"input": _images(np.random.default_rng(40), 2, 3, 12, 20)}
        return ZooModel(name, model, {"input": images}, resized=resized)
    if name == "transformer":
        torch.manual_seed(5)
        rng = np.random.default_rng(5)
        tokens = rng.integers(0, TinyEncoder.vocab, (SAMPLES, 12)).astype(np.int64)
        axes = {"tokens": {0: "N", 1: "T"}, "output": {0: "N", 1: "T"}}
        model = export(TinyEncoder(), (torch.from_numpy(tokens[:2]),), ["tokens"], ["output"], axes, exporter=exporter)
        resized = {"tokens": rng.integers(0, TinyEncoder.vocab, (3, 7)).astype(np.int64)}
        return ZooModel(name, model, {"tokens": tokens}, resized=resized)
    if name == "audio":
        torch.manual_seed(6)
        rng = np.random.default_rng(6)
        t = np.arange(400, dtype=np.float32) / 400
        audio = np.stack([np.sin(2 * np.pi * f * t) for f in rng.uniform(3, 60, SAMPLES)])[:, None, :]
        audio = (audio + rng.normal(0, 0.05, audio.shape)).astype(np.float32)
        axes = {"audio": {0: "N", 2: "L"}, "output": {0: "N"}}
        module = _randomize_batchnorm(AudioNet(), 6)
        model = export(module, (torch.from_numpy(audio[:2]),), ["audio"], ["output"], axes, exporter=exporter)
        resized = {"audio": rng.normal(0, 0.5, (2, 1, 256)).astype(np.float32)}
        return ZooModel(name, model, {"audio": audio}, resized=resized)
    if name == "legacy":
        torch.manual_seed(7)
        module = _randomize_batchnorm(LegacyCNN(), 7)
        images = _images(np.random.default_rng(7), SAMPLES, 1, 12, 12)
        axes = {"input": {0: "N"}, "output": {0: "N"}}
        model = export(module, (torch.from_numpy(images[:2]),), ["input"], ["output"], axes, opset=11)
        return ZooModel(name, model, {"input": images})
    if name == "branchy":
        return branchy()
    raise KeyError(f"no zoo model named {name!r}")


ZOO = ("resnet", "mobilenet", "unet", "detector", "transformer", "audio", "legacy", "branchy")
# exported from torch at the current opset, so either exporter can write them (legacy is opset 11, which
# the dynamo exporter does not write; branchy is built node by node)
EXPORTED = ("resnet", "mobilenet", "unet", "detector", "transformer", "audio")
