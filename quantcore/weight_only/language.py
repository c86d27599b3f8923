"""Causal language-model metrics of the weight-only report: perplexity and next-token accuracy on the
evaluation data, of the FP32 model and of the quantized model as deployed.

A model is a causal LM here when it has an output named ``logits`` of rank 3 (batch, positions,
vocabulary) and an integer input of rank 2 holding the tokens: ``input_ids``, else the model's only
integer input of rank 2. The logits at position t predict token t+1 of the same row:

    NLL = -(1/M) Σ over rows and t < T-1 of log softmax(logits[t])[ids[t+1]],    perplexity = exp(NLL)

M the positions counted; with an ``attention_mask`` input (1: a real token), a position counts where both
t and t+1 are real tokens. Next-token accuracy: the fraction of those positions whose argmax is ids[t+1].
Each batch is reduced as soon as it is run; only its logits are held.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches
from quantcore.runtime.session import open_session

STAGE = "evaluate"
LOGITS = "logits"
TOKENS = "input_ids"
MASK = "attention_mask"
INTEGER_TYPES = frozenset({onnx.TensorProto.INT32, onnx.TensorProto.INT64})


def token_input(model: onnx.ModelProto) -> str | None:
    """The tokens' input of a causal LM (module docstring), or None when ``model`` is none."""
    outputs = {o.name: o for o in model.graph.output}
    if LOGITS not in outputs or len(outputs[LOGITS].type.tensor_type.shape.dim) != 3:
        return None
    initializers = {t.name for t in model.graph.initializer}
    candidates = [
        i.name
        for i in model.graph.input
        if i.name not in initializers
        and i.type.tensor_type.elem_type in INTEGER_TYPES
        and len(i.type.tensor_type.shape.dim) == 2
        and i.name != MASK
    ]
    if TOKENS in candidates:
        return TOKENS
    return candidates[0] if len(candidates) == 1 else None


@dataclass
class NextToken:
    """Running sums of one model's next-token predictions."""

    nll: float = 0.0
    correct: int = 0
    positions: int = 0

    def update(self, logits: np.ndarray, tokens: np.ndarray, mask: np.ndarray | None) -> None:
        """Add a batch: logits (B, T, V), tokens (B, T), mask (B, T) or None."""
        logits = np.asarray(logits[:, :-1], dtype=np.float64)  # (B, T-1, V): position t predicts t+1
        targets = np.asarray(tokens[:, 1:], dtype=np.int64)
        counted = np.ones(targets.shape, dtype=bool) if mask is None else (mask[:, :-1] != 0) & (mask[:, 1:] != 0)
        peak = logits.max(axis=-1, keepdims=True)
        log_norm = peak[..., 0] + np.log(np.exp(logits - peak).sum(axis=-1))  # (B, T-1) log Σ exp
        chosen = np.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        self.nll += float(np.sum((log_norm - chosen)[counted]))
        self.correct += int(np.sum((logits.argmax(axis=-1) == targets)[counted]))
        self.positions += int(counted.sum())

    def to_dict(self) -> dict[str, float | None]:
        if not self.positions:
            return {"perplexity": None, "next_token_accuracy": None}
        return {"perplexity": math.exp(self.nll / self.positions), "next_token_accuracy": self.correct / self.positions}


def language_metrics(
    reference: onnx.ModelProto | str, quantized: Path, batches: Batches, tokens: str, device: str, monitor: Monitor
) -> dict[str, object]:
    """{"fp32": {perplexity, next_token_accuracy}, "quantized": the same, "positions": M,
    "perplexity_increase": quantized perplexity / FP32's - 1} over ``batches``; ``tokens``: ``token_input``."""
    sums = {"fp32": NextToken(), "quantized": NextToken()}
    with open_session(reference, device=device) as fp32, open_session(str(quantized), device=device) as deployed:
        for batch in batches:
            monitor.check(STAGE)
            mask = batch.get(MASK)
            for name, session in (("fp32", fp32), ("quantized", deployed)):
                sums[name].update(session.run([LOGITS], dict(batch))[0], batch[tokens], mask)
    result: dict[str, object] = {name: total.to_dict() for name, total in sums.items()}
    before, after = sums["fp32"].to_dict()["perplexity"], sums["quantized"].to_dict()["perplexity"]
    result["positions"] = sums["fp32"].positions
    result["perplexity_increase"] = after / before - 1.0 if before and after is not None else None
    return result
