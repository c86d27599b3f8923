"""Split a dataset into calibration and evaluation samples, deterministically from the seed.

The two never share a sample: evaluating on calibration data would flatter the report. The same
seed and dataset give the same split; `Split.record` states it (counts and a SHA-256 of the chosen
indices, or of the chosen file names for images) so a report says exactly what it measured.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from jobs.archives import ArchiveLimits, InvalidImageArchive, inspect_image_zip
from jobs.models import DatasetKind
from jobs.recipe import Recipe
from quantcore.errors import InvalidDataError
from worker.images import load_images

LABELS = "labels"


@dataclass(frozen=True)
class Split:
    calibration: dict[str, np.ndarray]
    evaluation: dict[str, np.ndarray]
    labels: np.ndarray | None  # of the evaluation samples
    calibration_indices: list[int]
    evaluation_indices: list[int]
    record: dict[str, Any] = field(default_factory=dict)


def split_indices(num_samples: int, recipe: Recipe) -> tuple[np.ndarray, np.ndarray]:
    """(calibration, evaluation) sample indices, each sorted: a seeded permutation whose first
    `num_eval` entries are held out and whose next `num_calibration` calibrate (`Recipe.split_sizes`)."""
    order = np.random.default_rng(recipe.seed).permutation(num_samples)
    num_calibration, num_eval = recipe.split_sizes(num_samples)
    return np.sort(order[num_eval : num_eval + num_calibration]), np.sort(order[:num_eval])


def _digest(items: Sequence[object]) -> str:
    return hashlib.sha256("\n".join(str(i) for i in items).encode()).hexdigest()


def _record(kind: str, seed: int, total: int, calibration: Sequence[object], evaluation: Sequence[object]) -> dict:
    return {
        "kind": kind,
        "seed": seed,
        "num_samples": total,
        "calibration": {"count": len(calibration), "sha256": _digest(calibration)},
        "evaluation": {"count": len(evaluation), "sha256": _digest(evaluation)},
    }


def split_dataset(path: Path, input_names: list[str], recipe: Recipe) -> Split:
    """An `.npz`: the model's inputs by name, and `labels` (1-D integers) when present."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files if name in input_names or name == LABELS}
    num_samples = next(iter(arrays.values())).shape[0]
    calibration_idx, evaluation_idx = split_indices(num_samples, recipe)
    labels = arrays.get(LABELS)
    calibration, evaluation = calibration_idx.tolist(), evaluation_idx.tolist()
    record = _record(DatasetKind.arrays.value, recipe.seed, num_samples, calibration, evaluation)
    record["hashed"] = "sample indices"
    record["label_source"] = None if labels is None else "npz array 'labels'"
    return Split(
        calibration={name: arrays[name][calibration_idx] for name in input_names},
        evaluation={name: arrays[name][evaluation_idx] for name in input_names},
        labels=None if labels is None else labels[evaluation_idx],
        calibration_indices=calibration,
        evaluation_indices=evaluation,
        record=record,
    )


def split_images(
    path: Path,
    input_names: list[str],
    recipe: Recipe,
    *,
    limits: ArchiveLimits,
    max_pixels: int,
    should_stop: Callable[[], object] = lambda: None,
) -> Split:
    """An image zip: the listing is re-read (sorted, so the same files in the same order as at upload),
    the split is drawn over it, and only the chosen images are decoded and preprocessed."""
    spec = recipe.preprocessing
    if spec is None:
        raise InvalidDataError("recipe.preprocessing is required for an image dataset")
    name = spec.input or input_names[0]
    try:
        listing = inspect_image_zip(path, limits=limits)
    except InvalidImageArchive as exc:  # checked at upload; only a changed limit or file gets here
        raise InvalidDataError(str(exc)) from exc
    calibration_idx, evaluation_idx = split_indices(len(listing.files), recipe)
    calibration_files = [listing.files[i] for i in calibration_idx]
    evaluation_files = [listing.files[i] for i in evaluation_idx]
    load = {"spec": spec, "max_pixels": max_pixels, "should_stop": should_stop}
    labels = None if listing.labels is None else np.asarray(listing.labels, np.int64)[evaluation_idx]
    record = _record(DatasetKind.images.value, recipe.seed, len(listing.files), calibration_files, evaluation_files)
    record["hashed"] = "member names, one per line"
    record["label_source"] = listing.label_source
    record["classes"] = listing.classes
    return Split(
        calibration={name: load_images(path, calibration_files, **load)},
        evaluation={name: load_images(path, evaluation_files, **load)},
        labels=labels,
        calibration_indices=calibration_idx.tolist(),
        evaluation_indices=evaluation_idx.tolist(),
        record=record,
    )
