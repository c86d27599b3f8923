"""The selection split: the calibration samples the auto search scores its candidates on.

A search that chose on the evaluation data would flatter the report it is judged by, and one that chose
on the data it calibrated with would favour the candidates that overfit it. So the last
``SELECTION_FRACTION`` of the calibration samples (at least ``MIN_SELECTION``; a multiple of a fixed batch
dimension) are held out of the candidates' calibration and scored on; the final evaluation data is never
touched by the search. Samples run along each input's batch axis (``quantcore.runtime.batching``); a
constant input goes whole into both parts. The final run calibrates on every calibration sample.

There are no labels for calibration samples, so a ``top1_drop`` objective is scored against the FP32
model's own predictions (``fp32_predictions``): the drop is then 100 x (1 - top-1 agreement with FP32).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantcore.errors import InvalidDataError
from quantcore.runtime.batching import Batches, InputSpec
from quantcore.runtime.session import open_session

SELECTION_FRACTION = 0.25
MIN_SELECTION = 8  # samples: fewer make the candidates' scores noise (one sample moves a cosine a lot)


@dataclass(frozen=True)
class SelectionSplit:
    """``calibration`` (what candidates calibrate on) and ``selection`` (what they are scored on), each
    ``{input name: array}``; ``indices``: the calibration sample indices of each part, disjoint."""

    calibration: dict[str, np.ndarray]
    selection: dict[str, np.ndarray]
    calibration_indices: range
    selection_indices: range


def split_selection(calibration: Mapping[str, np.ndarray], specs: list[InputSpec]) -> SelectionSplit:
    """Split ``calibration`` (checked against ``specs`` as calibrate would) as the module says. Raises
    ``InvalidDataError`` when both parts cannot have ``MIN_SELECTION`` samples (and a fixed batch)."""
    batches = Batches(calibration, specs, 1, what="calibration")
    total = batches.total_samples
    step = batches.batch_size if batches.fixed else 1
    count = math.ceil(max(MIN_SELECTION, math.ceil(total * SELECTION_FRACTION)) / step) * step
    if total - count < max(MIN_SELECTION, step):
        raise InvalidDataError(
            f"strategy auto needs at least {count + max(MIN_SELECTION, step)} calibration samples to hold "
            f"{count} out for choosing among its candidates, got {total}"
        )
    cut = total - count
    return SelectionSplit(batches.window(0, cut), batches.window(cut, count), range(0, cut), range(cut, total))


def fp32_predictions(model_path: str | Path, samples: Mapping[str, np.ndarray], specs: list[InputSpec]) -> np.ndarray:
    """(N,) the FP32 model's top-1 class per sample of ``samples``: the argmax of the first output of
    rank >= 2 flattened per sample, the output and rule ``quantcore.evaluate.evaluate`` scores top-1 on.
    Raises ``InvalidDataError`` when no output has rank >= 2."""
    predictions = []
    with open_session(model_path) as session:
        names = [output.name for output in session.get_outputs()]
        for batch in Batches(samples, specs, 16, what="selection"):
            outputs = session.run(names, batch)
            scores = next((np.asarray(o) for o in outputs if np.asarray(o).ndim >= 2), None)
            if scores is None:
                raise InvalidDataError("a top1_drop objective needs a model output of rank >= 2 to take argmax of")
            predictions.append(scores.reshape(len(scores), -1).argmax(axis=-1))
    return np.concatenate(predictions).astype(np.int64)
