"""Streaming agreement metrics between a reference output x and a quantized output x̂.

Accumulated batch by batch in float64 (sums only, nothing buffered); over all elements of all
samples::

    SQNR (dB)        = 10 · log10(Σ x² / Σ (x - x̂)²)          None when either sum is 0
    cosine           = Σ x·x̂ / sqrt(Σ x² · Σ x̂²)             None when either norm is 0
    max_abs_error    = max |x - x̂|
    mean_abs_error   = Σ |x - x̂| / #elements
    argmax_agreement = fraction of rows with argmax(x, -1) == argmax(x̂, -1), rank ≥ 2 only (else None)

SQNR of a perfect match is undefined (infinite) and reported as None, never as a large stand-in.
Non-finite quantized outputs make every metric of that output None and are counted in ``nonfinite``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


class OutputAgreement:
    """Accumulates the metrics above for one output tensor."""

    def __init__(self) -> None:
        self.sum_x2 = 0.0
        self.sum_y2 = 0.0
        self.sum_xy = 0.0
        self.sum_e2 = 0.0
        self.sum_abs = 0.0
        self.max_abs = 0.0
        self.elements = 0
        self.rows = 0
        self.rows_agree = 0
        self.nonfinite = 0

    def update(self, reference: np.ndarray, candidate: np.ndarray) -> None:
        if reference.shape != candidate.shape:
            raise ValueError(f"output shapes differ: {reference.shape} vs {candidate.shape}")
        x = reference.astype(np.float64, copy=False).ravel()
        y = candidate.astype(np.float64, copy=False).ravel()
        finite = np.isfinite(y) & np.isfinite(x)
        if not finite.all():
            self.nonfinite += int(finite.size - finite.sum())
        e = x - y
        self.sum_x2 += float(x @ x)
        self.sum_y2 += float(y @ y)
        self.sum_xy += float(x @ y)
        self.sum_e2 += float(e @ e)
        abs_e = np.abs(e)
        self.sum_abs += float(abs_e.sum())
        if abs_e.size:
            self.max_abs = max(self.max_abs, float(abs_e.max()))
        self.elements += e.size
        if reference.ndim >= 2 and reference.shape[-1] > 0:
            agree = reference.argmax(axis=-1) == candidate.argmax(axis=-1)
            self.rows += agree.size
            self.rows_agree += int(agree.sum())

    def result(self) -> dict[str, Any]:
        if self.nonfinite:
            return {
                "sqnr_db": None,
                "cosine": None,
                "max_abs_error": None,
                "mean_abs_error": None,
                "argmax_agreement": None,
                "nonfinite": self.nonfinite,
            }
        sqnr = 10.0 * math.log10(self.sum_x2 / self.sum_e2) if self.sum_x2 > 0 and self.sum_e2 > 0 else None
        norms = self.sum_x2 * self.sum_y2
        cosine = self.sum_xy / math.sqrt(norms) if norms > 0 else None
        return {
            "sqnr_db": sqnr,
            "cosine": cosine,
            "max_abs_error": self.max_abs,
            "mean_abs_error": self.sum_abs / self.elements if self.elements else None,
            "argmax_agreement": self.rows_agree / self.rows if self.rows else None,
            "nonfinite": 0,
        }


class TopOneAccuracy:
    """Fraction of samples whose argmax over the last axis equals the label."""

    def __init__(self) -> None:
        self.correct = 0
        self.total = 0

    def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
        predictions = logits.reshape(len(labels), -1).argmax(axis=-1)
        self.correct += int((predictions == labels).sum())
        self.total += len(labels)

    def result(self) -> float | None:
        return self.correct / self.total if self.total else None
