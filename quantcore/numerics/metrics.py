"""Streaming agreement metrics between a reference output x and a quantized output x̂.

Accumulated batch by batch in float64 (sums only, nothing buffered); over all elements of all
samples::

    SQNR (dB)        = 10 · log10(Σ x² / Σ (x - x̂)²)          None when either sum is 0
    cosine           = Σ x·x̂ / sqrt(Σ x² · Σ x̂²)             None when either norm is 0
    max_abs_error    = max |x - x̂|
    mean_abs_error   = Σ |x - x̂| / #elements
    argmax_agreement = fraction of rows with argmax(x, -1) == argmax(x̂, -1), rank ≥ 2 only (else None)
    relative_error_p50/p90/p99 = percentiles over samples of ‖x_i - x̂_i‖₂ / ‖x_i‖₂ (sample i = index on
                       the output's sample axis, 0 unless told; samples with ‖x_i‖ = 0 skipped; one
                       float per sample is kept)
    exact_match      = fraction of elements equal to FP32's (NaN = NaN)

SQNR of a perfect match is undefined (infinite) and reported as None, never as a large stand-in.
Where FP32's output is itself NaN or infinite (a log of 0, a masked score), the same value in the
quantized output agrees with it and is left out of the sums; a quantized output that is non-finite where
FP32's is not (or the other way round, or a different non-finite value) makes every metric of that
output None, and those elements are counted in ``nonfinite``.

Outputs are compared as runs return them, through ``as_array``: a sequence of maps with one key set
(a converted scikit-learn classifier's ZipMap of class probabilities) as the (items, keys) array of its
values. Float outputs get the metrics above (``comparison`` "numeric"); any other output (integer class
ids, booleans, strings, sequences that are no array) only ``exact_match`` (``comparison`` "equality"),
every other metric None.

Task metrics score one model's output against labels; ``TASK_METRICS`` maps a name to a factory of
``TaskMetric`` accumulators (built in: ``top1``, ``top5``), and ``register_task_metric`` adds one.
The evaluation runs every registered metric on the FP32 model and on each quantized mode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

RELATIVE_ERROR_PERCENTILES = (50, 90, 99)
RELATIVE_ERROR_KEYS = tuple(f"relative_error_p{p}" for p in RELATIVE_ERROR_PERCENTILES)


def as_array(value: Any) -> np.ndarray | None:
    """A run's output value as an array: a tensor as it is; a sequence of maps with one key set (ZipMap)
    as (items, keys) of its values in key order; a non-empty sequence of tensors of one shape, stacked;
    None for anything else."""
    if isinstance(value, np.ndarray):
        return value
    if not isinstance(value, list) or not value:
        return None
    if all(isinstance(item, dict) for item in value):
        keys = sorted(value[0])
        if any(sorted(item) != keys for item in value):
            return None
        return np.array([[item[k] for k in keys] for item in value])
    if all(isinstance(item, np.ndarray) and item.shape == value[0].shape for item in value):
        return np.stack(value)
    return None


def _same(a: Any, b: Any) -> bool:
    """Two items of non-array outputs (tensors of a ragged sequence, maps, strings) hold the same values."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    return bool(a == b)


class OutputAgreement:
    """Accumulates the metrics above for one output (``argmax=False``: no argmax agreement, which
    means nothing for an intermediate activation; ``sample_axis``: the axis its samples run along)."""

    def __init__(self, *, argmax: bool = True, sample_axis: int = 0) -> None:
        self.argmax = argmax
        self.sample_axis = sample_axis
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
        self.numeric = False  # a float output was seen (else: compared for equality only)
        self.equal = 0  # elements equal to the reference's, of ``compared``
        self.compared = 0
        self.relative_errors: list[np.ndarray] = []  # (samples,) per batch

    def update(self, reference: Any, candidate: Any) -> None:
        """One batch of an output: the FP32 model's value and the quantized model's, as a run returns them."""
        x_array, y_array = as_array(reference), as_array(candidate)
        if x_array is None or y_array is None or not np.issubdtype(x_array.dtype, np.floating):
            self._update_equality(reference if x_array is None else x_array, candidate if y_array is None else y_array)
            return
        reference, candidate, self.numeric = x_array, y_array, True
        if reference.shape != candidate.shape:
            raise ValueError(f"output shapes differ: {reference.shape} vs {candidate.shape}")
        x = reference.astype(np.float64, copy=False).ravel()
        y = candidate.astype(np.float64, copy=False).ravel()
        finite = np.isfinite(y) & np.isfinite(x)
        if finite.all():
            self.equal += int(np.count_nonzero(reference == candidate))
            self.elements += finite.size
        else:
            equal = (x == y) | (np.isnan(x) & np.isnan(y))
            self.equal += int(np.count_nonzero(equal))
            self.nonfinite += int(np.count_nonzero(~finite & ~equal))
            self.elements += int(np.count_nonzero(finite))
            x, y = np.where(finite, x, 0.0), np.where(finite, y, 0.0)  # agreeing non-finite values: out of the sums
        self.compared += finite.size
        e = x - y
        # einsum, not x @ x: BLAS's threaded dot stalls for tens of ms right after an ONNX Runtime run
        # (its spinning threads and BLAS's compete for the cores); einsum sums in one thread.
        self.sum_x2 += float(np.einsum("i,i->", x, x))
        self.sum_y2 += float(np.einsum("i,i->", y, y))
        self.sum_xy += float(np.einsum("i,i->", x, y))
        self.sum_e2 += float(np.einsum("i,i->", e, e))
        abs_e = np.abs(e)
        self.sum_abs += float(abs_e.sum())
        if abs_e.size:
            self.max_abs = max(self.max_abs, float(abs_e.max()))
        if reference.ndim > self.sample_axis and reference.shape[self.sample_axis] > 0:
            samples = reference.shape[self.sample_axis]
            rows_x = np.moveaxis(x.reshape(reference.shape), self.sample_axis, 0).reshape(samples, -1)
            norms = np.sqrt(np.einsum("ij,ij->i", rows_x, rows_x))  # (samples,)
            rows_e = np.moveaxis(e.reshape(reference.shape), self.sample_axis, 0).reshape(samples, -1)
            errors = np.sqrt(np.einsum("ij,ij->i", rows_e, rows_e))
            kept = norms > 0
            self.relative_errors.append(errors[kept] / norms[kept])
        if self.argmax and reference.ndim >= 2 and reference.shape[-1] > 0:
            agree = reference.argmax(axis=-1) == candidate.argmax(axis=-1)
            self.rows += agree.size
            self.rows_agree += int(agree.sum())

    def _update_equality(self, reference: Any, candidate: Any) -> None:
        if isinstance(reference, np.ndarray) and isinstance(candidate, np.ndarray):
            if reference.shape != candidate.shape:
                raise ValueError(f"output shapes differ: {reference.shape} vs {candidate.shape}")
            self.equal += int(np.count_nonzero(reference == candidate))
            self.compared += reference.size
            return
        items, others = (v if isinstance(v, list) else [v] for v in (reference, candidate))  # a map: one item
        if len(items) != len(others):
            raise ValueError(f"output lengths differ: {len(items)} vs {len(others)}")
        self.equal += sum(_same(a, b) for a, b in zip(items, others, strict=True))
        self.compared += len(items)

    def result(self) -> dict[str, Any]:
        exact_match = self.equal / self.compared if self.compared else None
        if self.compared and not self.numeric:
            return {
                **dict.fromkeys(("sqnr_db", "cosine", "max_abs_error", "mean_abs_error", "argmax_agreement")),
                **dict.fromkeys(RELATIVE_ERROR_KEYS),
                "nonfinite": 0,
                "exact_match": exact_match,
                "comparison": "equality",
            }
        if self.nonfinite:
            return {
                "sqnr_db": None,
                "cosine": None,
                "max_abs_error": None,
                "mean_abs_error": None,
                "argmax_agreement": None,
                **dict.fromkeys(RELATIVE_ERROR_KEYS),
                "nonfinite": self.nonfinite,
                "exact_match": exact_match,
                "comparison": "numeric",
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
            **self._relative_error_percentiles(),
            "nonfinite": 0,
            "exact_match": exact_match,
            "comparison": "numeric",
        }

    def _relative_error_percentiles(self) -> dict[str, float | None]:
        errors = np.concatenate(self.relative_errors) if self.relative_errors else np.empty(0)
        if not errors.size:
            return dict.fromkeys(RELATIVE_ERROR_KEYS)
        values = np.percentile(errors, RELATIVE_ERROR_PERCENTILES)
        return {key: float(v) for key, v in zip(RELATIVE_ERROR_KEYS, values, strict=True)}


class TaskMetric(Protocol):
    """Scores one model's output against labels, batch by batch."""

    def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
        """logits: (N, ...) the task output of one batch; labels: (N,) integer class ids."""

    def result(self) -> float | None:
        """The score over every batch seen, None when undefined."""


class TopKAccuracy:
    """Fraction of samples whose label is among the k largest scores (the logits flattened per sample).
    Undefined (None) with k or fewer classes, where it would be trivially 1."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.correct = 0
        self.total = 0
        self.trivial = False

    def update(self, logits: np.ndarray, labels: np.ndarray) -> None:
        scores = logits.reshape(len(labels), -1)  # (N, classes)
        if scores.shape[1] <= self.k and self.k > 1:
            self.trivial = True
            return
        if self.k == 1:
            hits = scores.argmax(axis=-1) == labels
        else:
            top = np.argpartition(-scores, self.k - 1, axis=-1)[:, : self.k]  # (N, k), unordered
            hits = (top == labels[:, None]).any(axis=-1)
        self.correct += int(hits.sum())
        self.total += len(labels)

    def result(self) -> float | None:
        return None if self.trivial or not self.total else self.correct / self.total


TASK_METRICS: dict[str, Callable[[], TaskMetric]] = {
    "top1": lambda: TopKAccuracy(1),
    "top5": lambda: TopKAccuracy(5),
}


def register_task_metric(name: str, factory: Callable[[], TaskMetric]) -> None:
    """Add a task metric; every later evaluation reports it for FP32 and each quantized mode."""
    if not name or name in TASK_METRICS:
        raise ValueError(f"task metric name {name!r} is empty or already registered")
    TASK_METRICS[name] = factory
