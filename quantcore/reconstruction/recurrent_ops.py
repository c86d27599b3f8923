"""ONNX LSTM as a torch function (``torch_ops.OPS`` convention): the specification's equations, one time
step after another, so that gradients flow through time as the exported model computes it.

Per direction, with W (4H, I), R (4H, H) and the biases Wb, Rb (4H,) split in gate order i, o, f, c:

    g_t = X_t·Wᵀ + H_{t-1}·Rᵀ + Wb + Rb            (B, 4H)
    i, o, f = sigmoid(g_i), sigmoid(g_o), sigmoid(g_f);  c = tanh(g_c)
    C_t = f ⊙ C_{t-1} + i ⊙ c;         H_t = o ⊙ tanh(C_t)

``direction`` forward, reverse (time walked from the last step, Y stored at each step's own position) or
bidirectional (both, Y's direction axis [forward, reverse]); ``layout`` 0 (X (T, B, I), Y (T, D, B, H),
states (D, B, H)) or 1 (X (B, T, I), Y (B, T, D, H), states (B, D, H)). Outputs Y, Y_h, Y_c.

Not converted (``CHECKS``): peepholes (input P), ``sequence_lens`` (per-sample lengths), ``clip``,
``input_forget`` and activations other than the default Sigmoid, Tanh, Tanh.
"""

from __future__ import annotations

from typing import Any

import onnx
import torch

DEFAULT_ACTIVATIONS = ("Sigmoid", "Tanh", "Tanh")


def _direction(x, w, r, b, h, c, reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One direction over x (T, B, I): (Y (T, B, H), H_T, C_T)."""
    hidden = r.shape[1]
    bias = b[: 4 * hidden] + b[4 * hidden :]  # Wb + Rb
    projected = x @ w.t() + bias  # (T, B, 4H): the input part of every step at once
    steps = range(x.shape[0] - 1, -1, -1) if reverse else range(x.shape[0])
    ys: list[torch.Tensor | None] = [None] * x.shape[0]
    for t in steps:
        gates = projected[t] + h @ r.t()
        i, o, f, g = gates.split(hidden, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        ys[t] = h
    return torch.stack(ys), h, c


def lstm(inputs, attrs):
    x, w, r = inputs[0], inputs[1], inputs[2]
    optional = [*inputs[3:], None, None, None, None, None]
    b, initial_h, initial_c = optional[0], optional[2], optional[3]
    layout = attrs.get("layout", 0)
    if layout:  # work in layout 0: X (T, B, I), states (D, B, H)
        x = x.transpose(0, 1)
        initial_h = None if initial_h is None else initial_h.transpose(0, 1)
        initial_c = None if initial_c is None else initial_c.transpose(0, 1)
    directions, hidden = w.shape[0], r.shape[2]
    zeros = x.new_zeros(directions, x.shape[1], hidden)
    b = x.new_zeros(directions, 8 * hidden) if b is None else b
    initial_h = zeros if initial_h is None else initial_h
    initial_c = zeros if initial_c is None else initial_c
    reverse = [attrs.get("direction", "forward") == "reverse"] if directions == 1 else [False, True]
    ys, hs, cs = [], [], []
    for d in range(directions):
        y, h, c = _direction(x, w[d], r[d], b[d], initial_h[d], initial_c[d], reverse[d])
        ys.append(y)
        hs.append(h)
        cs.append(c)
    y, y_h, y_c = torch.stack(ys, dim=1), torch.stack(hs), torch.stack(cs)  # (T, D, B, H), (D, B, H) twice
    if layout:
        return [y.permute(2, 0, 1, 3), y_h.transpose(0, 1), y_c.transpose(0, 1)]
    return [y, y_h, y_c]


def _check_lstm(node: onnx.NodeProto, attrs: dict[str, Any]) -> str | None:
    present = [i < len(node.input) and bool(node.input[i]) for i in range(8)]
    if present[7]:
        return "LSTM with peepholes (input P): not converted"
    if present[4]:
        return "LSTM with sequence_lens: per-sample lengths are not converted"
    if "clip" in attrs:
        return "LSTM clip: the cell clip is not converted"
    if attrs.get("input_forget", 0):
        return "LSTM input_forget 1: coupled input and forget gates are not converted"
    direction = attrs.get("direction", "forward")
    if direction not in ("forward", "reverse", "bidirectional"):
        return f"LSTM direction {direction!r} is not an ONNX direction"
    activations = tuple(attrs.get("activations", ()))
    expected = DEFAULT_ACTIVATIONS * (2 if direction == "bidirectional" else 1)
    if activations and activations != expected:
        return f"LSTM activations {list(activations)}: only the default {list(DEFAULT_ACTIVATIONS)} are converted"
    return None


OPS = {"LSTM": lstm}
CHECKS = {"LSTM": _check_lstm}
