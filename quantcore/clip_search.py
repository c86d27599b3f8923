"""Choosing the clipping percentile of the activations on the calibration data.

A ``percentile`` observer clips a tensor at the p-th percentile of |x|. Which p suits a model depends on
how much its outputs rely on the rare large values, and no single one suits every model: on the bench's
real models (``bench.quality``, 128 calibration samples, output SQNR dB at 99.9 / 99.99 / 99.999 / 100)
PP-OCR's direction classifier gives 11.4 / 17.4 / 19.0 / 15.7, openWakeWord's speech embedding 18.2 /
17.9 / 19.7 / 20.6 and its hey-jarvis classifier 32.7 / 30.5 / 27.0 / 24.1.

The calibration pass keeps histograms that give several percentiles at no extra cost
(``quantcore.calibration.calibrate_percentiles``). ``choose_percentile`` builds the exact Q/DQ model of
each candidate, runs it on the first ``SEARCH_SAMPLES`` calibration samples and keeps the candidate whose
worst float output comes closest to FP32 (SQNR; ties: the configured percentile). Calibration samples,
not evaluation ones, so the figures the report gives on the evaluation data are not the ones selected on;
with fewer than ``MIN_SAMPLES`` of them no choice is made.
Cost: one FP32 run over those samples, and one exact Q/DQ run per candidate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from quantcore.annotation import Annotation
from quantcore.batching import Batches
from quantcore.config import QuantizeConfig
from quantcore.metrics import OutputAgreement
from quantcore.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.qdq import build_qdq_model
from quantcore.session import PROTOBUF_LIMIT, open_session

STAGE = "clip"
SEARCH_SAMPLES = 32
# Calibration samples a choice needs. With the 16 of the test zoo's models the choice made on them was
# worse on held-out samples for 4 of 9 models (-0.9 to -1.9 dB) and better for 3 (+0.4 to +2.1); with
# 128 on the bench's real models, better for 5 of 9 and worse for 1 (bench/README.md, session 18).
MIN_SAMPLES = 64


@dataclass(frozen=True)
class PercentileChoice:
    """The percentile kept, its calibrated annotation, and every candidate's worst output SQNR (dB; +inf:
    the outputs matched exactly, -inf: some were not finite) on ``samples`` calibration samples."""

    percentile: float
    annotation: Annotation
    scores: dict[float, float]
    samples: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.percentile,
            "samples": self.samples,
            "candidates": [{"percentile": p, "sqnr_db": _finite_or_none(s)} for p, s in sorted(self.scores.items())],
        }

    @property
    def statement(self) -> str:
        scores = ", ".join(f"{p:g}: {s:.1f} dB" for p, s in sorted(self.scores.items()))
        return f"percentile {self.percentile:g} kept ({scores} on {self.samples} calibration samples)"


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def worst_sqnr(agreements: Mapping[str, OutputAgreement]) -> float:
    """The lowest output SQNR (dB): -inf if an output was not finite, +inf if every output matched."""
    results = [a.result() for a in agreements.values()]
    if any(r["nonfinite"] for r in results):
        return -math.inf
    return min((r["sqnr_db"] for r in results if r["sqnr_db"] is not None), default=math.inf)


def choose_percentile(
    prepared: PreparedModel,
    candidates: Mapping[float, Annotation],
    batches: Batches,
    config: QuantizeConfig,
    monitor: Monitor | None = None,
) -> PercentileChoice:
    """The candidate (percentile → calibrated annotation, ``config.percentile`` among them) whose exact Q/DQ
    model reproduces the FP32 outputs best on the first ``SEARCH_SAMPLES`` calibration samples. A model
    too large to hold in memory as one protobuf keeps the configured percentile, unscored."""
    monitor = monitor or Monitor()
    configured = config.percentile
    if len(candidates) == 1 or prepared.model.ByteSize() >= PROTOBUF_LIMIT:
        return PercentileChoice(configured, candidates[configured], {}, 0)
    samples = batches.first(SEARCH_SAMPLES)
    outputs = [o.name for o in prepared.model.graph.output]
    with open_session(prepared.model, device=config.device) as session:
        reference = [session.run(outputs, batch) for batch in samples]
    scores = {}
    for i, (percentile, annotation) in enumerate(candidates.items()):
        monitor.check(STAGE)
        agreements = {name: OutputAgreement(argmax=False) for name in outputs}
        with open_session(build_qdq_model(prepared, annotation), device=config.device, exact_qdq=True) as session:
            for batch, expected in zip(samples, reference, strict=True):
                for name, x, y in zip(outputs, expected, session.run(outputs, batch), strict=True):
                    if np.issubdtype(x.dtype, np.floating):
                        agreements[name].update(x, y)
        scores[percentile] = worst_sqnr({name: a for name, a in agreements.items() if a.elements})
        monitor.report(STAGE, (i + 1) / len(candidates), f"percentile {percentile:g}: {scores[percentile]:.1f} dB")
    chosen = max(scores, key=lambda p: (scores[p], p == configured))
    return PercentileChoice(chosen, candidates[chosen], scores, samples.num_samples)
