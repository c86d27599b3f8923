"""The few figures of a job's report.json that let jobs of one model be compared side by side.

Read from the stored report, not recomputed. Every figure is None when the report lacks it (a job
that failed, a report from an older format, a measurement the recipe switched off), never zero.

    top1_*         top-1 accuracy in [0, 1] on the held-out samples (when the dataset has labels):
                   FP32, the QDQ model in exact QDQ arithmetic, and as deployed on the CPU EP
    top1_drop      (FP32 - exact QDQ) x 100, in points
    sqnr_db_min    the lowest per-output SQNR, 10·log10(Σx² / Σ(x - x̂)²), exact QDQ vs FP32
    cosine_min     the lowest per-output cosine similarity, exact QDQ vs FP32
    sizes          bytes of the FP32 and the QDQ model files
    latency        CPU EP p50 at batch 1 in ms, FP32 and quantized (quantcore.evaluate.cpu_latency)
    target_met     with an accuracy target in the recipe: whether the model kept meets it
"""

from __future__ import annotations

from typing import Any


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _lowest(outputs: dict[str, Any], key: str) -> float | None:
    values = [v for v in (_number(_dict(o).get(key)) for o in outputs.values()) if v is not None]
    return min(values) if values else None


def report_summary(report: dict[str, Any]) -> dict[str, Any]:
    evaluation = _dict(report.get("evaluation"))
    exact = _dict(evaluation.get("qdq_exact"))
    deployed = _dict(evaluation.get("qdq_deployed"))
    outputs = _dict(exact.get("outputs"))
    top1_fp32 = _number(_dict(evaluation.get("fp32")).get("top1"))
    top1_exact = _number(exact.get("top1"))
    model = _dict(evaluation.get("model"))
    cpu = _dict(_dict(report.get("latency")).get("cpu"))
    target_met = _dict(report.get("target")).get("met")
    return {
        "metrics": {
            "top1_fp32": top1_fp32,
            "top1_quantized": top1_exact,
            "top1_deployed": _number(deployed.get("top1")),
            "top1_drop": None if top1_fp32 is None or top1_exact is None else (top1_fp32 - top1_exact) * 100,
            "sqnr_db_min": _lowest(outputs, "sqnr_db"),
            "cosine_min": _lowest(outputs, "cosine"),
            "argmax_agreement_min": _lowest(outputs, "argmax_agreement"),
            "num_samples": evaluation.get("num_samples") if isinstance(evaluation.get("num_samples"), int) else None,
            "target_met": target_met if isinstance(target_met, bool) else None,
        },
        "size": {"fp32_bytes": _number(model.get("fp32_bytes")), "quantized_bytes": _number(model.get("qdq_bytes"))},
        "latency": {
            "fp32_p50_ms": _number(_dict(_dict(cpu.get("fp32")).get("batch_1")).get("p50_ms")),
            "quantized_p50_ms": _number(_dict(_dict(cpu.get("quantized")).get("batch_1")).get("p50_ms")),
        },
    }


def recipe_summary(recipe: dict[str, Any]) -> dict[str, Any]:
    """platform, precision, observer (with its percentile), calibration samples, the reconstruction and
    accuracy-target sections as the recipe states them (None when absent), and the strategy with, for
    ``auto``, its section (a recipe stored before strategies existed is ``fixed``)."""
    calibration = _dict(recipe.get("calibration"))
    observer = calibration.get("observer")
    return {
        "platform": recipe.get("platform"),
        "precision": recipe.get("precision"),
        "observer": observer,
        "percentile": _number(calibration.get("percentile")) if observer == "percentile" else None,
        "calibration_samples": calibration.get("num_samples"),
        "reconstruction": recipe.get("reconstruction") or None,
        "target": recipe.get("target") or None,
        "strategy": recipe.get("strategy") or "fixed",
        "auto": (recipe.get("auto") or None) if recipe.get("strategy") == "auto" else None,
    }
