"""AdaRound's learned rounding of one weight tensor (Nagel et al. 2020), on a calibrated linear grid.

With per-channel (or per-tensor) scale s and integer offset o of the weight's ``TensorQuantConfig``::

    h(V)  = clip(sigmoid(V)·(zeta - gamma) + gamma, 0, 1)                 rectified sigmoid, zeta = 1.1, gamma = -0.1
    W̃     = (clip(⌊W/s⌋ + h(V) + o, quant_min, quant_max) - o) · s     soft (training)
    W_q   = (clip(⌊W/s⌋ + [V ≥ 0] + o, quant_min, quant_max) - o) · s  hard (after ``harden``)
    R(V)  = Σ (1 - |2h(V) - 1|^β)                        rounding regularizer, β annealed

V starts where h(V) equals the fractional part of W/s, so the soft weight starts equal to W (inside the
grid's range). Hard values are ⌊W/s⌋ or ⌊W/s⌋ + 1 before the clip: every weight stays on the grid, and
``grid_values`` are exactly (q - o)·s in float32, so the exporter's QuantizeLinear recovers q exactly.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from quantcore.numerics.linear import broadcast
from quantcore.numerics.tqc import TensorQuantConfig

ZETA, GAMMA = 1.1, -0.1
MODES = ("nearest", "soft", "hard")


def rectified_sigmoid(v: torch.Tensor) -> torch.Tensor:
    return torch.clamp(torch.sigmoid(v) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def beta_at(step: int, iters: int, *, warmup: float, beta_start: float, beta_end: float) -> float | None:
    """β at ``step`` of ``iters``: None during the warm-up (no rounding loss), then linear from
    ``beta_start`` to ``beta_end`` over the remaining steps."""
    start = int(warmup * iters)
    if step < start:
        return None
    progress = (step - start) / max(1, iters - start)
    return beta_end + (beta_start - beta_end) * max(0.0, 1.0 - progress)


class AdaRoundWeight(nn.Module):
    """The weight of one node, quantized with a learnable rounding. ``mode``: ``nearest`` (round to
    nearest, the calibrated baseline), ``soft`` (h(V), training), ``hard`` (after ``harden``)."""

    def __init__(self, weight: np.ndarray, tqc: TensorQuantConfig, device: torch.device) -> None:
        super().__init__()
        if tqc.floating or tqc.scale is None:
            raise ValueError("AdaRound needs a calibrated linear config")
        self.tqc = tqc
        self.axis = tqc.channel_axis if tqc.per_channel else None
        w = torch.from_numpy(np.asarray(weight, np.float32)).to(device)
        self.scale = broadcast(torch.from_numpy(np.array(tqc.scale, np.float32)).to(device), w.ndim, self.axis)
        self.offset = broadcast(torch.from_numpy(np.array(tqc.offset, np.float32)).to(device), w.ndim, self.axis)
        self.register_buffer("weight", w)  # (original W; never updated)
        scaled = w / self.scale
        self.register_buffer("floor", torch.floor(scaled))
        rest = (scaled - self.floor).clamp(1e-6, 1 - 1e-6)  # h(V) = rest ⇔ sigmoid(V) = (rest - gamma)/(zeta - gamma)
        self.v = nn.Parameter(-torch.log((ZETA - GAMMA) / (rest - GAMMA) - 1))
        self.mode = "nearest"

    def _grid(self, codes: torch.Tensor) -> torch.Tensor:
        q = torch.clamp(codes + self.offset, self.tqc.quant_min, self.tqc.quant_max)
        return (q - self.offset) * self.scale

    def forward(self) -> torch.Tensor:
        if self.mode == "soft":
            return self._grid(self.floor + rectified_sigmoid(self.v))
        if self.mode == "hard":
            return self._grid(self.floor + (self.v >= 0).to(self.floor.dtype))
        return self._grid(torch.round(self.weight / self.scale))  # half-even, as the exporter

    def regularizer(self, beta: float) -> torch.Tensor:
        """R(V) = Σ (1 - |2h(V) - 1|^β)."""
        return (1 - (2 * rectified_sigmoid(self.v) - 1).abs().pow(beta)).sum()

    def harden(self) -> None:
        self.mode = "hard"

    def grid_values(self) -> np.ndarray:
        """The current weight as float32 values on the grid, (q - o)·s, W's shape."""
        with torch.no_grad():
            return self.forward().detach().cpu().numpy().astype(np.float32)
