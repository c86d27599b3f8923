"""QAT's loss and held-out metric: the quantized graph's outputs ŷ against the FP32 model's y on the same
samples (the FP32 model is the teacher), optionally with labels.

Each float graph output has a kind (``output_kinds``), read from the graph:

    probabilities   produced by a Softmax node, directly or through ops that only reshape (``RESHAPING_OPS``:
                    a Softmax over (B·T, C) put back to (B, T, C)), whose values sum to 1 along the last axis
                    (the axis the kl loss reads as the classes)
    scores          any other float output of shape (B, C), C ≥ 2: class logits, as the evaluation's
                    task metrics read the first such output
    values          every other float output
    intermediate    a tensor inside the graph chosen for distillation (``QatConfig.intermediate``)

Loss per output, summed over outputs (``Distillation.loss``):

    mse   mean((ŷ - y)²) / mean(y²)          mean(y²) over the training split, a constant per output: each
                                             term is a noise-to-signal ratio (1/SQNR), so outputs of
                                             different magnitudes weigh alike
    kl    scores:        KL(softmax(y) ‖ softmax(ŷ)), averaged over the batch
          probabilities: Σ y·(log y - log ŷ), averaged over the batch (ŷ, y floored at 1e-12 in the logs)
          values:        as mse
    intermediate: as mse, whatever ``loss``

    labels (``label_weight`` w > 0): + w · CE(label output, labels), averaged over the batch; the label
    output is the first class output (scores: cross-entropy of softmax(ŷ); probabilities: -log ŷ[label],
    ŷ floored at 1e-12).

Metric (``Distillation.sqnr_db``): per graph output 10·log10(Σ y² / Σ (ŷ - y)²) over the held-out split,
the mean over outputs in dB (intermediate tensors and labels do not count); +inf where ŷ equals y
exactly, -inf where y is all zeros and ŷ is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import torch
import torch.nn.functional as F

PROBABILITY_FLOOR = 1e-12  # log(0) guard for probabilities a quantized Softmax rounds to 0
CLASS_KINDS = ("scores", "probabilities")
RESHAPING_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})  # values unchanged
SUM_TOLERANCE = 1e-3  # |Σ_c y - 1| allowed: float32 rounding of a Softmax row's sum, far below a row of another axis


def _softmax_output(name: str, producers: Mapping[str, onnx.NodeProto], target: np.ndarray) -> bool:
    """Whether ``name`` is a Softmax's output, seen through ``RESHAPING_OPS``, with rows along the last axis
    that sum to 1 (a Softmax over another axis, or reshaped across its class axis, is not)."""
    node = producers.get(name)
    while node is not None and node.op_type in RESHAPING_OPS:
        node = producers.get(node.input[0])
    if node is None or node.op_type != "Softmax" or target.ndim < 2:
        return False
    return bool(np.all(np.abs(target.sum(-1, dtype=np.float64) - 1) <= SUM_TOLERANCE))


def output_kinds(model: onnx.ModelProto, names: Sequence[str], targets: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Output name → probabilities | scores | values (module docstring), for the float ``names``."""
    producers = {o: node for node in model.graph.node for o in node.output}
    kinds = {}
    for name in names:
        shape = targets[name].shape
        if _softmax_output(name, producers, targets[name]):
            kinds[name] = "probabilities"
        elif len(shape) == 2 and shape[1] >= 2:
            kinds[name] = "scores"
        else:
            kinds[name] = "values"
    return kinds


def label_output(kinds: Mapping[str, str]) -> str | None:
    """The output a label loss reads: the first of kind scores or probabilities (None: no class output)."""
    return next((name for name, kind in kinds.items() if kind in CLASS_KINDS), None)


class Distillation:
    """The loss of ``loss`` ("mse" | "kl") over the tensors of ``kinds`` (outputs first, then intermediate
    tensors), plus ``label_weight`` times the label cross-entropy of ``label_output(kinds)``; ``power``: each
    tensor's mean(y²) on the training split (the mse normaliser)."""

    def __init__(
        self, loss: str, kinds: Mapping[str, str], power: Mapping[str, float], label_weight: float = 0.0
    ) -> None:
        self.loss_name = loss
        self.kinds = dict(kinds)
        self.power = {name: max(float(p), float(np.finfo(np.float32).tiny)) for name, p in power.items()}
        self.label_weight = label_weight
        self.label_output = label_output(self.kinds)  # read only with label_weight > 0, where it exists

    @property
    def outputs(self) -> list[str]:
        """The graph outputs distilled (the metric's), without the intermediate tensors."""
        return [name for name, kind in self.kinds.items() if kind != "intermediate"]

    def _term(self, name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        kind = self.kinds[name]
        if self.loss_name == "kl" and kind == "scores":
            log_output, log_target = F.log_softmax(output, -1), F.log_softmax(target, -1)
            return F.kl_div(log_output, log_target, log_target=True, reduction="batchmean")
        if self.loss_name == "kl" and kind == "probabilities":
            log_output = torch.log(output.clamp_min(PROBABILITY_FLOOR))
            log_target = torch.log(target.clamp_min(PROBABILITY_FLOOR))
            return (target * (log_target - log_output)).sum(-1).mean()
        return ((output - target) ** 2).mean() / self.power[name]

    def _label_term(self, output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.kinds[self.label_output] == "probabilities":
            return F.nll_loss(torch.log(output.clamp_min(PROBABILITY_FLOOR)), labels)
        return F.cross_entropy(output, labels)

    def loss(
        self,
        outputs: Mapping[str, torch.Tensor],
        targets: Mapping[str, torch.Tensor],
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The batch's loss; ``labels`` (B,) int64 class ids, required when ``label_weight`` > 0."""
        total = sum((self._term(name, outputs[name], targets[name]) for name in self.kinds), torch.zeros(()))
        if self.label_weight > 0:
            total = total + self.label_weight * self._label_term(outputs[self.label_output], labels)
        return total

    def sqnr_db(self, outputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]) -> float:
        """Mean over the graph outputs of 10·log10(Σ y² / Σ (ŷ - y)²), float64 sums."""
        values = []
        for name in self.outputs:
            y = targets[name].astype(np.float64)
            signal, noise = float((y**2).sum()), float(((outputs[name].astype(np.float64) - y) ** 2).sum())
            values.append(math.inf if noise == 0 else -math.inf if signal == 0 else 10 * math.log10(signal / noise))
        return float(np.mean(values))
