"""Does a dataset fit a model? Checked when a job is created, before anything is queued.

Each model input needs an array of the same name and dtype whose rank matches and whose
non-sample dimensions equal the model's fixed dimensions (symbolic ones accept any size).
Arrays the model does not take are allowed (`labels`, for instance).
"""

from __future__ import annotations

from typing import Any


def dataset_mismatches(model_info: dict[str, Any], arrays: list[dict[str, Any]]) -> list[str]:
    """Human-readable reasons the dataset cannot feed the model; empty when it fits."""
    by_name = {a["name"]: a for a in arrays}
    problems: list[str] = []
    for spec in model_info.get("inputs", []):
        name = spec["name"]
        array = by_name.get(name)
        if array is None:
            problems.append(f"input '{name}' has no array in the dataset (arrays: {sorted(by_name)})")
            continue
        if array["dtype"] != spec["dtype"]:
            problems.append(f"input '{name}' expects dtype {spec['dtype']}, the dataset has {array['dtype']}")
        model_shape, data_shape = spec["shape"], array["shape"]
        if len(model_shape) != len(data_shape):
            problems.append(
                f"input '{name}' expects rank {len(model_shape)} {model_shape}, the dataset has "
                f"rank {len(data_shape)} {data_shape} (first axis = samples)"
            )
            continue
        for axis, (want, have) in enumerate(zip(model_shape[1:], data_shape[1:], strict=True), start=1):
            if isinstance(want, int) and want > 0 and want != have:
                problems.append(f"input '{name}' axis {axis} must be {want}, the dataset has {have} {data_shape}")
    return problems
