"""Per-sample scores on the selection split, and the choice that keeps the earlier candidate within noise.

A candidate's score is one number over the selection split's samples (8 or more, often 16 to 32), and
where every candidate meets the objective the scores differ in the fourth decimal of a cosine: a
difference that another draw of the same kind of samples would not repeat. So each candidate's outputs
are kept per sample (``sample_sums``: ``quantcore.numerics.paired_scores.SampleSums``), and candidates are
compared by their paired bootstrap interval (``paired_scores.difference``).

``choose``: a later candidate replaces an earlier one only when it is better beyond that interval. The
chosen one is the earliest candidate that no other beats beyond the interval, preferring those that meet
the objective (a within-noise candidate that meets it saves the accuracy-target fallback). Earlier
candidates are the cheaper, simpler changes of the user's config (``quantcore.auto.candidates``).
Comparing every pair at 95 % makes a false "beyond" more likely than 5 % among many candidates; its cost is
a later candidate chosen that is only as good, which is where the search stood before this rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from quantcore.numerics.paired_scores import SampleSums, SumsBuilder, difference
from quantcore.runtime.batching import Batches, InputSpec, output_batch_axes
from quantcore.runtime.session import open_session


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
    builder = SumsBuilder(metric)
    agreement: list[np.ndarray] = []  # top-1: per batch (count, 1)
    start = 0
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
                agreement.append((predicted == labels[start : start + count])[:, None])
            else:
                for name, x, y in zip(names, expected, actual, strict=True):
                    builder.add(name, x, y, axes[name], count)
            start += count
    if metric == "top1_drop":
        return SampleSums(metric, {"top1": np.concatenate(agreement)})
    return builder.result()
