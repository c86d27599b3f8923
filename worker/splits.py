"""Split a dataset into calibration and evaluation samples, deterministically from the seed.

The two never share a sample: evaluating on calibration data would flatter the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from jobs.recipe import Recipe

LABELS = "labels"


@dataclass(frozen=True)
class Split:
    calibration: dict[str, np.ndarray]
    evaluation: dict[str, np.ndarray]
    labels: np.ndarray | None  # of the evaluation samples
    calibration_indices: list[int]
    evaluation_indices: list[int]


def split_dataset(path: Path, input_names: list[str], recipe: Recipe) -> Split:
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files if name in input_names or name == LABELS}
    num_samples = next(iter(arrays.values())).shape[0]
    order = np.random.default_rng(recipe.seed).permutation(num_samples)
    num_eval = min(max(1, round(num_samples * recipe.evaluation.holdout_fraction)), num_samples - 1)
    num_eval = min(num_eval, recipe.evaluation.max_samples)
    evaluation_idx = np.sort(order[:num_eval])
    calibration_idx = np.sort(order[num_eval:][: recipe.calibration.num_samples])
    labels = arrays.get(LABELS)
    return Split(
        calibration={name: arrays[name][calibration_idx] for name in input_names},
        evaluation={name: arrays[name][evaluation_idx] for name in input_names},
        labels=None if labels is None else labels[evaluation_idx],
        calibration_indices=calibration_idx.tolist(),
        evaluation_indices=evaluation_idx.tolist(),
    )
