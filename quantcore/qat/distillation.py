"""QAT's loss and held-out metric: the quantized graph's outputs ŷ against the FP32 model's y on the same
samples (the FP32 model is the teacher; no labels).

Each float graph output has a kind (``output_kinds``), read from the graph:

    probabilities   produced by a Softmax node
    scores          any other float output of shape (B, C), C ≥ 2: class logits, as the evaluation's
                    task metrics read the first such output
    values          every other float output

Loss per output, summed over outputs (``Distillation.loss``):

    mse   mean((ŷ - y)²) / mean(y²)          mean(y²) over the training split, a constant per output: each
                                             term is a noise-to-signal ratio (1/SQNR), so outputs of
                                             different magnitudes weigh alike
    kl    scores:        KL(softmax(y) ‖ softmax(ŷ)), averaged over the batch
          probabilities: Σ y·(log y - log ŷ), averaged over the batch (ŷ, y floored at 1e-12 in the logs)
          values:        as mse

Metric (``Distillation.sqnr_db``): per output 10·log10(Σ y² / Σ (ŷ - y)²) over the held-out split, the
mean over outputs in dB; +inf where ŷ equals y exactly, -inf where y is all zeros and ŷ is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import torch
import torch.nn.functional as F

PROBABILITY_FLOOR = 1e-12  # log(0) guard for probabilities a quantized Softmax rounds to 0


def output_kinds(model: onnx.ModelProto, names: Sequence[str], targets: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Output name → probabilities | scores | values (module docstring), for the float ``names``."""
    producers = {o: node.op_type for node in model.graph.node for o in node.output}
    kinds = {}
    for name in names:
        shape = targets[name].shape
        if producers.get(name) == "Softmax":
            kinds[name] = "probabilities"
        elif len(shape) == 2 and shape[1] >= 2:
            kinds[name] = "scores"
        else:
            kinds[name] = "values"
    return kinds


class Distillation:
    """The loss of ``loss`` ("mse" | "kl") over the outputs of ``kinds``; ``power``: each output's
    mean(y²) on the training split (the mse normaliser)."""

    def __init__(self, loss: str, kinds: Mapping[str, str], power: Mapping[str, float]) -> None:
        self.loss_name = loss
        self.kinds = dict(kinds)
        self.power = {name: max(float(p), float(np.finfo(np.float32).tiny)) for name, p in power.items()}

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

    def loss(self, outputs: Mapping[str, torch.Tensor], targets: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return sum((self._term(name, outputs[name], targets[name]) for name in self.kinds), torch.zeros(()))

    def sqnr_db(self, outputs: Mapping[str, np.ndarray], targets: Mapping[str, np.ndarray]) -> float:
        """Mean over outputs of 10·log10(Σ y² / Σ (ŷ - y)²), float64 sums."""
        values = []
        for name in self.kinds:
            y = targets[name].astype(np.float64)
            signal, noise = float((y**2).sum()), float(((outputs[name].astype(np.float64) - y) ** 2).sum())
            values.append(math.inf if noise == 0 else -math.inf if signal == 0 else 10 * math.log10(signal / noise))
        return float(np.mean(values))
