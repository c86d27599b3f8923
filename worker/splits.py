"""Split a dataset into calibration and evaluation samples, deterministically from the seed.

The two never share a sample: evaluating on calibration data would flatter the report. The same
seed and dataset give the same split; `Split.record` states it (counts, the axis each input's samples
were taken along, and a SHA-256 of the chosen indices, or of the chosen file names for images) so a
report says exactly what it measured.

Samples run along each model input's batch axis, by quantcore's rule (`quantcore.runtime.batching`): a
state declared (2, batch, 128) is split along axis 1, and a constant input (a scalar sample rate)
goes whole into both parts. `labels` holds one integer per sample; the evaluation samples' are
`Split.labels`, the calibration samples' `Split.calibration_labels` (QAT's label loss).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
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
    calibration_labels: np.ndarray | None = None


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


def count_samples(arrays: Mapping[str, np.ndarray], axes: Mapping[str, int | None]) -> int:
    """The number of samples the batched inputs of ``axes`` (input name → batch axis, None: constant)
    agree on; ``InvalidDataError`` naming the input and axis when one lacks its array or they disagree."""
    counts = {}
    for name, axis in axes.items():
        if name not in arrays:
            raise InvalidDataError(f"the dataset has no array for model input {name!r} (arrays: {sorted(arrays)})")
        if axis is None:
            continue
        if arrays[name].ndim <= axis:
            raise InvalidDataError(
                f"array {name!r} has shape {arrays[name].shape}; the model's samples run along its axis {axis}"
            )
        counts[name] = (axis, arrays[name].shape[axis])
    if not counts:
        raise InvalidDataError(f"no model input has a batch axis to take samples along ({list(axes)})")
    if len({samples for _, samples in counts.values()}) > 1:
        listed = ", ".join(f"{name!r} axis {axis}: {samples}" for name, (axis, samples) in counts.items())
        raise InvalidDataError(f"inputs disagree on the number of samples along their batch axes ({listed})")
    return next(iter(counts.values()))[1]


def split_dataset(path: Path, axes: Mapping[str, int | None], recipe: Recipe) -> Split:
    """An `.npz`: the model's inputs by name, each split along its batch axis (``axes``: input name →
    axis, None for a constant input, which both parts get whole), and `labels` when present."""
    with np.load(path, allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files if name in axes or name == LABELS}
    num_samples = count_samples(arrays, axes)
    labels = arrays.get(LABELS) if LABELS not in axes else None
    if labels is not None and labels.shape != (num_samples,):
        raise InvalidDataError(
            f"array {LABELS!r} has shape {labels.shape}; it needs one label per sample ({num_samples})"
        )
    calibration_idx, evaluation_idx = split_indices(num_samples, recipe)

    def take(indices: np.ndarray) -> dict[str, np.ndarray]:
        return {
            name: arrays[name] if axis is None else np.take(arrays[name], indices, axis=axis)
            for name, axis in axes.items()
        }

    calibration, evaluation = calibration_idx.tolist(), evaluation_idx.tolist()
    record = _record(DatasetKind.arrays.value, recipe.seed, num_samples, calibration, evaluation)
    record["batch_axes"] = dict(axes)
    record["hashed"] = "sample indices"
    record["label_source"] = None if labels is None else "npz array 'labels'"
    return Split(
        calibration=take(calibration_idx),
        evaluation=take(evaluation_idx),
        labels=None if labels is None else labels[evaluation_idx],
        calibration_indices=calibration,
        evaluation_indices=evaluation,
        record=record,
        calibration_labels=None if labels is None else labels[calibration_idx],
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
    all_labels = None if listing.labels is None else np.asarray(listing.labels, np.int64)
    record = _record(DatasetKind.images.value, recipe.seed, len(listing.files), calibration_files, evaluation_files)
    record["batch_axes"] = {name: 0}  # images are stacked along the first axis
    record["hashed"] = "member names, one per line"
    record["label_source"] = listing.label_source
    record["classes"] = listing.classes
    return Split(
        calibration={name: load_images(path, calibration_files, **load)},
        evaluation={name: load_images(path, evaluation_files, **load)},
        labels=None if all_labels is None else all_labels[evaluation_idx],
        calibration_indices=calibration_idx.tolist(),
        evaluation_indices=evaluation_idx.tolist(),
        record=record,
        calibration_labels=None if all_labels is None else all_labels[calibration_idx],
    )
