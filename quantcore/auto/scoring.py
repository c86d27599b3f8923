"""Per-sample scores on the selection split, and the choice that keeps the earlier candidate within noise.

A candidate's score is one number over the selection split's samples (8 or more, often 16 to 32), and
where every candidate meets the objective the scores differ in the fourth decimal of a cosine: a
difference that another draw of the same kind of samples would not repeat. So each candidate's outputs
are kept per sample as sums (``sample_sums``), from which the objective's metric over any resample of the
samples follows exactly as ``quantcore.analysis.accuracy_target.measure`` computes it over all of them:

    cosine   min over float outputs o of  Σ_i xy_io / sqrt(Σ_i xx_io · Σ_i yy_io)
    sqnr     min over float outputs o of  10 · log10(Σ_i xx_io / Σ_i ee_io)      (+inf: ee = 0)
    top1     100 · (1 - mean_i agree_i)  (agreement of argmax with the FP32 model's, ``top1_drop``)

where x is FP32's output and y the candidate's, i a sample (a batch where an output has no axis of one
entry per sample). ``difference`` resamples the samples with replacement ``DRAWS`` times (seeded), the
same draws for both candidates (their errors on one sample are correlated, which pairing cancels), and
gives the 95 % percentile interval of their score difference.

``choose``: a later candidate replaces an earlier one only when it is better beyond that interval. The
chosen one is the earliest candidate that no other beats beyond the interval, preferring those that meet
the objective (a within-noise candidate that meets it saves the accuracy-target fallback). Earlier
candidates are the cheaper, simpler changes of the user's config (``quantcore.auto.candidates``).
Comparing every pair at 95 % makes a false "beyond" more likely than 5 % among many candidates; its cost is
a later candidate chosen that is only as good, which is where the search stood before this rule.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from quantcore.numerics.metrics import as_array
from quantcore.runtime.batching import Batches, InputSpec, output_batch_axes
from quantcore.runtime.session import open_session

DRAWS = 1000
SEED = 0
LEVEL = 95.0  # % interval


@dataclass(frozen=True)
class SampleSums:
    """One candidate's outputs against FP32's on the selection split, per sample (see module): for
    cosine/SQNR, output name -> (n, 4) columns Σxy, Σxx, Σyy, Σee; for top-1, ``"top1"`` -> (n, 1)
    agreement (0 or 1). ``defined`` False: an output was non-finite where FP32's was not (no score)."""

    metric: str
    sums: dict[str, np.ndarray]
    defined: bool = True

    @property
    def samples(self) -> int:
        return len(next(iter(self.sums.values()))) if self.sums else 0

    def scores(self, index: np.ndarray) -> np.ndarray:
        """(...,) the metric over each resample; ``index`` (..., n) sample indices."""
        if not self.defined or not self.sums:
            return np.full(index.shape[:-1], np.nan)
        if self.metric == "top1_drop":
            return 100.0 * (1.0 - self.sums["top1"][index, 0].mean(axis=-1))
        values = []
        for columns in self.sums.values():
            xy, xx, yy, ee = (columns[index, k].sum(axis=-1) for k in range(4))
            with np.errstate(divide="ignore", invalid="ignore"):
                if self.metric == "cosine":
                    values.append(xy / np.sqrt(xx * yy))
                else:
                    values.append(np.where(ee == 0, np.inf, 10.0 * np.log10(xx / ee)))
        return np.min(values, axis=0)


@dataclass(frozen=True)
class Difference:
    """Score of a minus score of b in the objective's better direction (> 0: a is better), and its
    paired interval; ``beyond``: the interval excludes 0 on a's side."""

    value: float
    low: float
    high: float

    @property
    def beyond(self) -> bool:
        return self.low > 0

    def to_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high}


def difference(a: SampleSums, b: SampleSums, higher_is_better: bool) -> Difference:
    """a against b on the same samples (see module). An undefined score is the worst (-inf in the better
    direction); two undefined ones, or two infinite SQNRs, differ by 0."""
    n = a.samples or b.samples
    draws = _draws(n)
    every = np.arange(n)
    sign = 1.0 if higher_is_better else -1.0

    def oriented(sums: SampleSums, index: np.ndarray) -> np.ndarray:
        scores = sign * sums.scores(index)
        return np.where(np.isnan(scores), -np.inf, scores)

    with np.errstate(invalid="ignore"):
        spread = oriented(a, draws) - oriented(b, draws)
        value = float(oriented(a, every) - oriented(b, every))
    spread = np.where(np.isnan(spread), 0.0, spread)
    low, high = np.percentile(spread, [(100 - LEVEL) / 2, (100 + LEVEL) / 2], method="nearest")
    return Difference(0.0 if math.isnan(value) else value, float(low), float(high))


def worse_end(sums: SampleSums, higher_is_better: bool) -> float:
    """The score at the worse end of its 95 % interval over resamples of the samples (``difference``'s draws):
    what another draw of the same kind of samples could read. NaN where the score is undefined."""
    scores = sums.scores(_draws(sums.samples))
    if np.isnan(scores).any():
        return math.nan
    worse = (100 - LEVEL) / 2 if higher_is_better else (100 + LEVEL) / 2
    return float(np.percentile(scores, worse, method="nearest"))


def _draws(n: int) -> np.ndarray:
    """(DRAWS, n) sample indices drawn with replacement, seeded: the same for every candidate."""
    return np.random.default_rng(SEED).integers(0, n, size=(DRAWS, n))


def choose(sums: Sequence[SampleSums], met: Sequence[bool], higher_is_better: bool) -> int:
    """Index (in ``sums``' order, earliest first) of the candidate kept, as the module says."""
    beaten = [
        any(difference(other, mine, higher_is_better).beyond for j, other in enumerate(sums) if j != i)
        for i, mine in enumerate(sums)
    ]
    unbeaten = [i for i in range(len(sums)) if not beaten[i]] or list(range(len(sums)))
    return next((i for i in unbeaten if met[i]), unbeaten[0])


def _deployed_session(stack: ExitStack, qdq_model: Path, deployed: dict[str, Any], device: str) -> ort.InferenceSession:
    """A session of ``qdq_model`` as ``evaluate`` measured it (``deployed``: its ``qdq_deployed`` entry): exact
    Q/DQ where the deployed session could not be built, basic optimization where only that could."""
    if deployed.get("skipped"):
        return stack.enter_context(open_session(qdq_model, device=device, exact_qdq=True))
    optimization = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if deployed.get("fallback") else None
    return stack.enter_context(
        open_session(
            qdq_model,
            device=device,
            optimization=optimization,
            disabled_optimizers=deployed.get("disabled_optimizers", ()),
        )
    )


def _add_sums(parts: list[np.ndarray], x: np.ndarray, y: np.ndarray, axis: int, count: int) -> bool:
    """Append one batch's (units, 4) sums of a float output (FP32 ``x``, candidate ``y``; units: its ``count``
    samples along ``axis``, or the batch as one); False when ``y`` is non-finite where ``x`` is not."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    finite = np.isfinite(x) & np.isfinite(y)
    agreeing = (x == y) | (np.isnan(x) & np.isnan(y))
    x, y = np.where(finite, x, 0.0), np.where(finite, y, 0.0)  # agreeing non-finite values: out of the sums
    units = count if x.ndim > axis and x.shape[axis] == count else 1
    x, y = (np.moveaxis(v, axis, 0).reshape(units, -1) if units > 1 else v.reshape(1, -1) for v in (x, y))
    e = x - y
    parts.append(np.stack([np.einsum("ij,ij->i", p, q) for p, q in ((x, y), (x, x), (y, y), (e, e))], axis=1))
    return bool((finite | agreeing).all())


def sample_sums(
    model_path: str | Path,
    qdq_model: str | Path,
    samples: dict[str, np.ndarray],
    specs: list[InputSpec],
    evaluation: dict[str, Any],
    *,
    metric: str,
    labels: np.ndarray | None,
    batch_size: int,
    device: str = "cpu",
) -> SampleSums:
    """``qdq_model``'s ``SampleSums`` on ``samples``, run as its ``evaluation`` (``evaluate``'s report of it on
    the same samples) measured it; ``labels``: the FP32 predictions a ``top1_drop`` is scored against."""
    fp32_proto = onnx.load(str(model_path), load_external_data=False)
    names = [o.name for o in fp32_proto.graph.output]
    axes = output_batch_axes(fp32_proto)
    rows: dict[str, list[np.ndarray]] = {}  # output -> per batch (units, 4) or (units, 1)
    defined, start = True, 0
    with ExitStack() as stack:
        fp32 = stack.enter_context(open_session(model_path, device=device))
        quantized = _deployed_session(stack, Path(qdq_model), evaluation["qdq_deployed"], device)
        batches = Batches(samples, specs, batch_size, what="selection")
        for batch in batches:
            count = min(batches.batch_size, batches.num_samples - start)
            expected = fp32.run(names, batch)
            actual = quantized.run(names, batch)
            if metric == "top1_drop":
                scores = next(np.asarray(y) for y in actual if np.asarray(y).ndim >= 2)
                predicted = scores.reshape(count, -1).argmax(axis=-1)
                rows.setdefault("top1", []).append((predicted == labels[start : start + count])[:, None])
            else:
                for name, x, y in zip(names, expected, actual, strict=True):
                    x, y = as_array(x), as_array(y)
                    if x is None or y is None or not np.issubdtype(x.dtype, np.floating):
                        continue  # integer, string...: derived from the float outputs the metric is measured on
                    defined &= _add_sums(rows.setdefault(name, []), x, y, axes[name], count)
            start += count
    if len({sum(len(part) for part in parts) for parts in rows.values()}) > 1:
        # an output without one entry per sample: every output's units become whole batches
        rows = {name: [part.sum(axis=0, keepdims=True) for part in parts] for name, parts in rows.items()}
    return SampleSums(metric, {name: np.concatenate(parts) for name, parts in rows.items()}, defined)
