"""Does a dataset fit a model? Checked when a job is created, before anything is queued.

Samples run along each model input's *batch axis*, which the worker recorded on the model when it
validated the upload (``info["inputs"][i]["batch_axis"]``, by quantcore's one rule,
``quantcore.runtime.batching``): a recurrent state declared ``(2, batch, 128)`` batches along axis 1, and a
constant input (``None``: a scalar sample rate, say) takes its array as the value itself, the same
for every batch. Models validated before the axis was recorded count samples on axis 0 (`batch_axis`).

Each model input needs an array of the same name and dtype whose rank matches and whose dimensions
other than the batch axis equal the model's fixed ones (symbolic ones accept any size). The batched
inputs must agree on the number of samples, at least 2 (some calibrate, some evaluate), and `labels`,
when present, holds one integer per sample. Other arrays are allowed and ignored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LABELS = "labels"
MIN_SAMPLES = 2


def batch_axis(spec: dict[str, Any]) -> int | None:
    """The axis a model input's samples run along (None: a constant input). Rows recorded before the
    axis was: 0, as the service then assumed (None for a scalar, which has no axis)."""
    if "batch_axis" in spec:
        return spec["batch_axis"]
    return None if spec["shape"] == [] else 0


def _samples_on(axis: int | None) -> str:
    return "a constant input: the array is the value itself" if axis is None else f"samples on axis {axis}"


def _input_mismatches(spec: dict[str, Any], array: dict[str, Any]) -> list[str]:
    name, axis = spec["name"], batch_axis(spec)
    problems = []
    if array["dtype"] != spec["dtype"]:
        problems.append(f"input '{name}' expects dtype {spec['dtype']}, the dataset has {array['dtype']}")
    model_shape, data_shape = spec["shape"], array["shape"]
    if model_shape is None:  # rank unknown: only the batch axis must exist
        if axis is not None and len(data_shape) <= axis:
            problems.append(f"input '{name}' has {_samples_on(axis)}, the dataset's array is {data_shape}")
        return problems
    if len(model_shape) != len(data_shape):
        problems.append(
            f"input '{name}' expects rank {len(model_shape)} {model_shape} ({_samples_on(axis)}), the dataset "
            f"has rank {len(data_shape)} {data_shape}"
        )
        return problems
    for dim, (want, have) in enumerate(zip(model_shape, data_shape, strict=True)):
        if dim != axis and isinstance(want, int) and want > 0 and want != have:
            problems.append(
                f"input '{name}' axis {dim} must be {want}, the dataset has {have} {data_shape} "
                f"(model shape {model_shape}, {_samples_on(axis)})"
            )
    return problems


LEGACY = (
    "the model was validated before batch axes were recorded, so samples were assumed on axis 0 of every "
    "input; upload the model again to have each input's batch axis derived"
)


def dataset_mismatches(model_info: dict[str, Any], arrays: list[dict[str, Any]]) -> list[str]:
    """Human-readable reasons the dataset (``[{name, dtype, shape}]``) cannot feed the model; empty
    when it fits. Every reason names the input and, for shapes and sample counts, the axis."""
    problems = _mismatches(model_info, arrays)
    legacy = any("batch_axis" not in spec for spec in model_info.get("inputs", []))
    return [*problems, LEGACY] if problems and legacy else problems


def _mismatches(model_info: dict[str, Any], arrays: list[dict[str, Any]]) -> list[str]:
    by_name = {a["name"]: a for a in arrays}
    problems: list[str] = []
    counts: dict[str, tuple[int, int]] = {}  # batched input → (its batch axis, samples along it)
    inputs = model_info.get("inputs", [])
    for spec in inputs:
        name, axis = spec["name"], batch_axis(spec)
        array = by_name.get(name)
        if array is None:
            problems.append(f"input '{name}' has no array in the dataset (arrays: {sorted(by_name)})")
            continue
        found = _input_mismatches(spec, array)
        problems += found
        if axis is not None and not found:
            counts[name] = (axis, array["shape"][axis])
    if problems:
        return problems
    if not counts:
        if inputs:
            problems.append(f"no model input has a batch axis to take samples along ({[i['name'] for i in inputs]})")
        return problems
    listed = ", ".join(f"'{name}' axis {axis}: {samples}" for name, (axis, samples) in counts.items())
    sizes = {samples for _, samples in counts.values()}
    if len(sizes) > 1:
        return [f"inputs disagree on the number of samples, counted along each input's batch axis ({listed})"]
    num_samples = sizes.pop()
    if num_samples < MIN_SAMPLES:
        problems.append(f"the dataset has {num_samples} sample(s) ({listed}); at least {MIN_SAMPLES} are needed")
    labels = by_name.get(LABELS) if LABELS not in {i["name"] for i in inputs} else None
    if labels is not None and (labels["shape"] != [num_samples] or np.dtype(labels["dtype"]).kind not in "iu"):
        problems.append(
            f"array '{LABELS}' must hold one integer per sample, shape [{num_samples}] ({listed}); "
            f"the dataset has {labels['dtype']} {labels['shape']}"
        )
    return problems
