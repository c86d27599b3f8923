"""Choosing where the activations are clipped, on the calibration data: a percentile, or the MSE threshold.

A ``percentile`` observer clips a tensor at the p-th percentile of |x|. Which p suits a model depends on
how much its outputs rely on the rare large values, and no single one suits every model: on the bench's
real models (``bench.quality``, 128 calibration samples, output SQNR dB at 99.9 / 99.99 / 99.999 / 100)
PP-OCR's direction classifier gives 11.4 / 17.4 / 19.0 / 15.7, openWakeWord's speech embedding 18.2 /
17.9 / 19.7 / 20.6 and its hey-jarvis classifier 32.7 / 30.5 / 27.0 / 24.1.

The calibration pass keeps histograms that give several percentiles at no extra cost, and each tensor's
MSE threshold estimated on the same histogram (``quantcore.observers.clipping.mse_amax``): the candidates
(``quantcore.calibrate.calibration.calibrate_clips``). No one rule suits every model either: with the ``mse``
observer instead of the percentile, the bench's held-out SQNR moved by -1.5 to +7.7 dB across its real
models of ``bench.quality``. ``choose_clip`` builds the exact Q/DQ model of each candidate,
runs it on the first ``SEARCH_SAMPLES`` calibration samples and keeps the candidate whose worst float
output comes closest to FP32 (SQNR; ties: the configured clip). Calibration samples,
not evaluation ones, so the figures the report gives on the evaluation data are not the ones selected on;
with fewer than ``MIN_SAMPLES`` of them no choice is made.
Cost: one FP32 run over those samples, and one exact Q/DQ run per candidate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from quantcore.annotate.annotation import Annotation
from quantcore.calibrate.calibration import Clip, configured_clip
from quantcore.config import QuantizeConfig
from quantcore.export.qdq import build_qdq_model
from quantcore.numerics.metrics import OutputAgreement
from quantcore.prepare.preparation import PreparedModel
from quantcore.progress import Monitor
from quantcore.runtime.batching import Batches
from quantcore.runtime.session import open_session

STAGE = "clip"
SEARCH_SAMPLES = 32
# Calibration samples a choice needs. With the 16 of the test zoo's models the choice made on them was
# worse on held-out samples for 4 of 9 models (-0.9 to -1.9 dB) and better for 3 (+0.4 to +2.1); with
# 128 on the bench's real models (``bench.quality``), better for 5 of 9 and worse for 1. 48, not 64:
# the auto search's candidates calibrate on 3/4 of the job's samples (``quantcore.auto.selection``), and
# in a job of 64 the candidate that is scored must search its clip as the final run, on all 64, does;
# 48 still gives the thresholds 1.5 times the ``SEARCH_SAMPLES`` the choice is scored on.
MIN_SAMPLES = 48


@dataclass(frozen=True)
class ClipChoice:
    """The clip kept (a percentile, or ``"mse"``), its calibrated annotation, the percentile the run goes
    on with (with ``"mse"``: the configured one, whose histograms the thresholds were read from), and
    every candidate's worst output SQNR (dB; +inf: the outputs matched exactly, -inf: some were not
    finite) on ``samples`` calibration samples."""

    clip: Clip
    percentile: float
    annotation: Annotation
    scores: dict[Clip, float]
    samples: int

    def applied(self, config: QuantizeConfig) -> QuantizeConfig:
        """``config`` going on with the clip kept (re-calibrations then give the same ranges)."""
        if self.clip == "mse":
            return replace(config, clip="mse")
        return replace(config, clip="percentile", percentile=self.clip)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.percentile,
            "clip": _kind(self.clip),
            "samples": self.samples,
            "candidates": [
                {
                    "clip": _kind(c),
                    "percentile": None if c == "mse" else c,
                    "sqnr_db": _finite_or_none(self.scores[c]),
                }
                for c in _ordered(self.scores)
            ],
        }

    @property
    def statement(self) -> str:
        scores = ", ".join(f"{_name(c)}: {self.scores[c]:.1f} dB" for c in _ordered(self.scores))
        return f"{_name(self.clip)} kept ({scores} on {self.samples} calibration samples)"


def _ordered(clips: Iterable[Clip]) -> list[Clip]:
    """Percentiles in increasing order, then ``"mse"``."""
    return sorted(clips, key=lambda c: (c == "mse", 0.0 if c == "mse" else c))


def _kind(clip: Clip) -> str:
    """The report's name for a candidate's kind: ``percentile`` or ``mse``."""
    return "mse" if clip == "mse" else "percentile"


def _name(clip: Clip) -> str:
    return "mse threshold" if clip == "mse" else f"percentile {clip:g}"


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def worst_sqnr(agreements: Mapping[str, OutputAgreement]) -> float:
    """The lowest output SQNR (dB): -inf if an output was not finite, +inf if every output matched."""
    results = [a.result() for a in agreements.values()]
    if any(r["nonfinite"] for r in results):
        return -math.inf
    return min((r["sqnr_db"] for r in results if r["sqnr_db"] is not None), default=math.inf)


def choose_clip(
    prepared: PreparedModel,
    candidates: Mapping[Clip, Annotation],
    batches: Batches,
    config: QuantizeConfig,
    monitor: Monitor | None = None,
) -> ClipChoice:
    """The candidate (clip → calibrated annotation, ``configured_clip(config)`` among them) whose exact
    Q/DQ model reproduces the FP32 outputs best on the first ``SEARCH_SAMPLES`` calibration samples."""
    monitor = monitor or Monitor()
    configured = configured_clip(config)
    if len(candidates) == 1:
        return ClipChoice(configured, config.percentile, candidates[configured], {}, 0)
    samples = batches.first(SEARCH_SAMPLES)
    outputs = [o.name for o in prepared.model.graph.output]
    with open_session(prepared.model, device=config.device) as session:
        reference = [session.run(outputs, batch) for batch in samples]
    scores = {}
    for i, (clip, annotation) in enumerate(candidates.items()):
        monitor.check(STAGE)
        agreements = {name: OutputAgreement(argmax=False) for name in outputs}
        with open_session(build_qdq_model(prepared, annotation), device=config.device, exact_qdq=True) as session:
            for batch, expected in zip(samples, reference, strict=True):
                for name, x, y in zip(outputs, expected, session.run(outputs, batch), strict=True):
                    agreements[name].update(x, y)
        scores[clip] = worst_sqnr({name: a for name, a in agreements.items() if a.elements})  # float outputs
        monitor.report(STAGE, (i + 1) / len(candidates), f"{_name(clip)}: {scores[clip]:.1f} dB")
    chosen = max(scores, key=lambda c: (scores[c], c == configured))
    percentile = config.percentile if chosen == "mse" else chosen
    return ClipChoice(chosen, percentile, candidates[chosen], scores, samples.num_samples)
