"""Reads of report.json's documented sections (`jobs/report_schema.py`) that tolerate a missing or
odd-shaped section: an older format, a stage the recipe switched off, a hand-edited file. A read
that finds the wrong type gets the empty value, so the summary leaves that part out."""

from __future__ import annotations

from typing import Any

# evaluation.<mode>: the quantized model as quantcore simulates it, and as ONNX Runtime runs it
QUANTIZED_MODES = {"qdq_exact": "exact QDQ", "qdq_deployed": "deployed"}


def as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def mode_outputs(evaluation: dict[str, Any], mode: str) -> dict[str, dict[str, Any]]:
    """`evaluation.<mode>.outputs`: output name → its metrics against FP32."""
    outputs = as_dict(as_dict(evaluation.get(mode)).get("outputs"))
    return {str(name): metrics for name, metrics in outputs.items() if isinstance(metrics, dict)}


def lowest_output_metric(evaluation: dict[str, Any], key: str) -> tuple[float, str, str] | None:
    """(value, mode label, output) of the lowest `key` (cosine, sqnr_db) over both quantized modes."""
    found = [
        (metrics[key], label, name)
        for mode, label in QUANTIZED_MODES.items()
        for name, metrics in mode_outputs(evaluation, mode).items()
        if is_number(metrics.get(key))
    ]
    return min(found, key=lambda item: item[0]) if found else None
