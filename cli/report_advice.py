"""What the summary says when the quantized model is much less accurate or slower than FP32, and the
recipe changes the service supports that may help, written as `--set` options of `quantctl quantize`
and `quantctl jobs submit` (the fields of `jobs.recipe.Recipe`).

Much less accurate: an output's cosine to FP32 below COSINE_FLOOR or its SQNR below SQNR_FLOOR_DB
(either quantized mode), top-1 more than TOP1_DROP below FP32's, or a target the run did not meet.
Slower: a CPU p50 speed-up below 1 at any batch size.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from cli.report_fields import as_dict, as_list, is_number, lowest_output_metric

COSINE_FLOOR = 0.99  # below it the outputs visibly disagree (a 0.99 cosine is an angle of 8 degrees)
SQNR_FLOOR_DB = 20.0  # error energy above 1% of the signal's
TOP1_DROP = 0.01  # one point of top-1 accuracy
EXCLUDE_AT_MOST = 3  # worst-ranked layers proposed for float; the target mode searches further
TINY_MODEL_MS = 0.1  # FP32 p50 at batch 1 under which Q/DQ overhead outweighs the integer arithmetic
# Another observer to try, per observer: a clipping one for range-keeping ones and the reverse.
OTHER_OBSERVER = {"minmax": "percentile", "ema_minmax": "percentile", "kl": "percentile", "percentile": "mse"}
OTHER_OBSERVER_DEFAULT = "percentile"
CPU_PLATFORMS = ("onnxruntime", "onnxruntime-dynamic")


def advice(report: dict[str, Any]) -> str:
    accuracy, speed = _accuracy_findings(report), _speed_findings(report)
    if not accuracy and not speed:
        return ""
    tries = (_accuracy_tries(report) if accuracy else []) + (_speed_tries(report) if speed else [])
    lines = ["attention:", *(f"  - {finding}" for finding in accuracy + speed)]
    if tries:
        lines += ["what to try (options of quantctl quantize / jobs submit):", *(f"  - {line}" for line in tries)]
    return "\n".join(lines)


def platform_recommendation(report: dict[str, Any]) -> str:
    """The onnxruntime platform recommended with the figures the worker measured for it and for the model
    kept (``latency.cpu_alternative``: a tensorrt job with no engine whose recipe named no platform)."""
    measured = as_dict(as_dict(report.get("latency")).get("cpu_alternative"))
    if not measured:
        return ""
    speedups, cosines = as_dict(measured.get("speedup_p50")), as_dict(measured.get("cosine"))
    output = measured.get("output")

    def figures(label: str) -> str:
        speed = ", ".join(
            f"{value:.2f}x at batch {str(key).removeprefix('batch_')}"
            for key, value in as_dict(speedups.get(label)).items()
            if is_number(value)
        )
        cosine = cosines.get(label)
        return f"{speed or 'not timed'}; cosine {cosine:.5g}" if is_number(cosine) else speed or "not timed"

    platform = str(measured.get("platform") or "onnxruntime")
    return "\n".join(
        [
            f"recommended: platform {platform} ({measured.get('why') or 'no TensorRT engine was built'})",
            f"  measured on the worker's CPU (p50 speed-up over FP32; cosine to FP32 of output {output}, as deployed):",
            f"    this model (tensorrt rules, its Q/DQ run as float on a CPU): {figures('default')}",
            f"    platform {platform} ({measured.get('objective') or 'its preset'}): {figures(platform)}",
            "  its default cpu_objective latency also keeps float the regions slower quantized: never slower than FP32",
            f"  quantize again with: {_option('platform', platform)}",
        ]
    )


def _accuracy_findings(report: dict[str, Any]) -> list[str]:
    evaluation = as_dict(report.get("evaluation"))
    below = []
    for key, floor, name, unit in (("cosine", COSINE_FLOOR, "cosine", ""), ("sqnr_db", SQNR_FLOOR_DB, "SQNR", " dB")):
        lowest = lowest_output_metric(evaluation, key)
        if lowest and lowest[0] < floor:
            value, mode, output = lowest
            below.append(f"{name} {value:.4g}{unit} on {output} ({mode}; below {floor:g}{unit})")
    findings = [f"much less accurate than FP32: {', '.join(below)}"] if below else []
    fp32_top1 = as_dict(evaluation.get("fp32")).get("top1")
    quantized_top1 = [as_dict(evaluation.get(mode)).get("top1") for mode in ("qdq_exact", "qdq_deployed")]
    if is_number(fp32_top1) and (scores := [v for v in quantized_top1 if is_number(v)]):
        drop = fp32_top1 - min(scores)
        if drop > TOP1_DROP:
            findings.append(f"top-1 is {drop * 100:.1f} points below FP32's ({fp32_top1:.4g} -> {min(scores):.4g})")
    target = as_dict(report.get("target"))
    if target.get("met") is False:
        findings.append(f"the accuracy target ({target.get('statement') or 'as set'}) was not met")
    return findings


def _speed_findings(report: dict[str, Any]) -> list[str]:
    cpu = as_dict(as_dict(report.get("latency")).get("cpu"))
    slow = [
        f"{value:.2f}x at batch {str(key).removeprefix('batch_')}"
        for key, value in as_dict(cpu.get("speedup_p50")).items()
        if is_number(value) and value < 1
    ]
    if not slow:
        return []
    findings = [f"slower than FP32 on the CPU: {', '.join(slow)} (p50 speed-up)"]
    deployed = as_dict(as_dict(report.get("evaluation")).get("qdq_deployed"))
    if deployed.get("integer_kernels") == 0:
        findings.append(
            "ONNX Runtime ran no integer kernels: the quantized ops computed in float between Quantize and "
            "Dequantize steps"
        )
    fp32_ms = as_dict(as_dict(cpu.get("fp32")).get("batch_1")).get("p50_ms")
    if is_number(fp32_ms) and fp32_ms < TINY_MODEL_MS:
        findings.append(
            f"FP32 takes {fp32_ms:.3g} ms at batch 1: for a model this small the Quantize/Dequantize steps "
            "cost more than the integer arithmetic saves"
        )
    return findings


def _accuracy_tries(report: dict[str, Any]) -> list[str]:
    config = as_dict(report.get("config"))
    tries = []
    if config.get("strategy") != "auto" and not config.get("target"):  # auto and a target are exclusive
        tries.append(
            "let the service try observers, equalization, bias correction, SmoothQuant and AdaRound and keep "
            f"the best on calibration samples it holds out: {_option('strategy', 'auto')}"
        )
    if worst := _worst_layers(report):
        patterns = list(dict.fromkeys([*map(str, as_list(config.get("exclude_node_patterns"))), *worst]))
        tries.append(
            f"keep the worst-ranked layers ({', '.join(worst)}) in float: "
            + _option("exclude.node_patterns", json.dumps(patterns))
        )
    target = as_dict(config.get("target"))
    if not target:
        labelled = is_number(as_dict(as_dict(report.get("evaluation")).get("fp32")).get("top1"))
        metric, threshold = ("top1_drop", "1") if labelled else ("cosine", f"{COSINE_FLOOR:g}")
        tries.append(
            "let the service keep the most harmful layers in float until an accuracy target is met: "
            f"{_option('target.metric', metric)} {_option('target.threshold', threshold)}"
        )
    elif is_number(target.get("max_float_layers")) and as_dict(report.get("target")).get("met") is False:
        tries.append(f"allow the target more float layers: {_option('target.max_float_layers', 'null')}")
    observer = str(config.get("observer") or "")
    other = OTHER_OBSERVER.get(observer, OTHER_OBSERVER_DEFAULT)
    if observer != other:
        tries.append(f"another observer: {_option('calibration.observer', other)}")
    if not config.get("reconstruction"):
        tries.append(
            "learn the weights' rounding (minutes per block on a CPU): " + _option("reconstruction.method", "qdrop")
        )
    bits = re.fullmatch(r"w(\d)a(\d)", str(config.get("precision") or ""))
    if bits and min(map(int, bits.groups())) < 8:
        tries.append(f"more bits: {_option('precision', 'w8a8')}")
    if "MatMul" in _op_types(report) and config.get("platform") != "onnxruntime-dynamic":
        tries.append(
            "for ONNX Runtime on a CPU, quantize only the MatMuls' weights and each batch's own activation range: "
            + _option("platform", "onnxruntime-dynamic")
        )
    return tries


def _speed_tries(report: dict[str, Any]) -> list[str]:
    config = as_dict(report.get("config"))
    platform = str(config.get("platform") or "")
    if platform == "onnxruntime":
        matmuls = "MatMul" in _op_types(report)
        return (
            [f"quantize MatMul activations at run time: {_option('platform', 'onnxruntime-dynamic')}"]
            if matmuls
            else []
        )
    if platform in CPU_PLATFORMS:
        return []
    tries = [f"place Q/DQ where ONNX Runtime's CPU EP has integer kernels: {_option('platform', 'onnxruntime')}"]
    if platform.startswith("tensorrt") and config.get("tensorrt_engine") is False:
        # the tensorrt platforms place Q/DQ for TensorRT: its engine is what runs faster, not the CPU EP
        tries.append(f"or time the TensorRT engine on a GPU worker: {_option('deploy.tensorrt_engine', 'true')}")
    return tries


def _worst_layers(report: dict[str, Any]) -> list[str]:
    """Analyzed layers whose quantization alone drops SQNR below the floor, worst first (by `rank`);
    without any, the worst-ranked one."""
    layers = [
        layer for layer in map(as_dict, as_list(as_dict(report.get("analysis")).get("layers"))) if layer.get("node")
    ]
    layers.sort(key=lambda layer: layer["rank"] if is_number(layer.get("rank")) else float("inf"))
    analyzed = [layer for layer in layers if layer.get("analyzed") is not False]
    harmful = [layer for layer in analyzed if is_number(layer.get("sqnr_db")) and layer["sqnr_db"] < SQNR_FLOOR_DB]
    return [str(layer["node"]) for layer in (harmful or analyzed[:1])[:EXCLUDE_AT_MOST]]


def _op_types(report: dict[str, Any]) -> set[str]:
    return {str(layer.get("op_type")) for layer in map(as_dict, as_list(as_dict(report.get("analysis")).get("layers")))}


def _option(field: str, value: str) -> str:
    return "--set " + shlex.quote(f"{field}={value}")
