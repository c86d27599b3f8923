"""The human summary of a job report (`quantctl jobs report ID`, and the end of `quantctl quantize`;
`--json` prints the raw report).

The report is read by its documented layout (`jobs/report_schema.py`, format ``quantcore.report/1``),
section by section, in this order: the run's settings, the verdicts (deployment parity, accuracy
target), what to try when the model is much worse or slower than FP32 and the platform to use on a CPU
when no engine was built (`cli.report_advice`), the
per-output error of the two quantized modes, the task metrics, the clip search, the layers ranked by
harm (in the report's `rank` order), the target's steps, reconstruction, sizes, the CPU benchmark,
stage times, the engine and the warnings. A section the report lacks (an older format, a stage the
recipe switched off) is left out; nothing here raises on an unexpected shape.
"""

from __future__ import annotations

from typing import Any

from cli.report_advice import advice, platform_recommendation
from cli.report_fields import QUANTIZED_MODES, as_dict, as_list, is_number, mode_outputs

OUTPUT_METRICS = {
    "sqnr_db": "SQNR dB",
    "cosine": "cosine",
    "max_abs_error": "max abs err",
    "mean_abs_error": "mean abs err",
    "argmax_agreement": "argmax agree",
    "exact_match": "exact match",
    "nonfinite": "non-finite",
}
TASK_TITLES = {"top1": "top-1", "top5": "top-5"}
MODES = {"fp32": "FP32", **QUANTIZED_MODES}
WORST_LAYERS = 5


def render_report(report: Any) -> str:
    if not isinstance(report, dict):
        return f"report: {report!r}"
    evaluation = as_dict(report.get("evaluation"))
    sections = [
        _header(report),
        _verdicts(report),
        advice(report),
        platform_recommendation(report),
        _outputs_table(evaluation),
        _task_metrics(evaluation),
        _clip_search(as_dict(report.get("calibration")).get("percentile_search")),
        _layers(as_dict(report.get("analysis"))),
        _target_steps(as_dict(report.get("target"))),
        _reconstruction(as_dict(report.get("reconstruction"))),
        _sizes(as_dict(evaluation.get("model"))),
        _latency(as_dict(report.get("latency")).get("cpu")),
        _stage_times(as_dict(report.get("stage_seconds"))),
        _engine(report.get("engine")),
        _warnings(report),
    ]
    text = "\n\n".join(section for section in sections if section)
    return text or "the report holds nothing this client knows how to summarize (try --json)"


def _header(report: dict[str, Any]) -> str:
    config = as_dict(report.get("config"))
    fields = [
        f"{key}: {value}"
        for key in ("platform", "precision", "observer")
        if isinstance(value := config.get(key), str | int | float)
    ]
    if excluded := [str(name) for name in as_list(config.get("exclude_node_patterns"))]:
        fields.append(f"kept in float: {', '.join(excluded)}")
    lines = ["  ".join(fields)] if fields else []
    if is_number(samples := as_dict(report.get("evaluation")).get("num_samples")):
        lines.append(f"evaluated on {samples} held-out samples")
    return "\n".join(lines)


def _verdicts(report: dict[str, Any]) -> str:
    lines = []
    parity = as_dict(report.get("parity"))
    if isinstance(parity.get("reason"), str):
        lines.append(f"deployment: {parity['reason']}")
        if isinstance(parity.get("remedy"), str):
            lines.append(f"  remedy applied: {parity['remedy']}")
    skipped = as_dict(as_dict(report.get("evaluation")).get("qdq_deployed")).get("skipped")
    if isinstance(skipped, str):
        lines.append(f"deployed model not run: {skipped}")
    target = as_dict(report.get("target"))
    if isinstance(target.get("verdict"), str):
        lines.append(f"accuracy target: {target['verdict']}")
    return "\n".join(lines)


def _outputs_table(evaluation: dict[str, Any]) -> str:
    rows = [
        (MODES[mode], name, metrics)
        for mode in QUANTIZED_MODES
        for name, metrics in mode_outputs(evaluation, mode).items()
    ]
    # A column shows only where some output has the figure (non-finite only where it happened).
    columns = [
        key
        for key in OUTPUT_METRICS
        if any(is_number(metrics.get(key)) and (key != "nonfinite" or metrics[key]) for _, _, metrics in rows)
    ]
    if not rows or not columns:
        return ""
    table = [["mode", "output", *(OUTPUT_METRICS[key] for key in columns)]]
    table += [[mode, name, *(_format_metric(metrics.get(key)) for key in columns)] for mode, name, metrics in rows]
    return "per-output error, quantized vs FP32\n" + _table(table)


def _task_metrics(evaluation: dict[str, Any]) -> str:
    """One line per task metric that has a value (top-5 of a 2-class model is undefined: no line)."""
    scores = {mode: as_dict(evaluation.get(mode)) for mode in MODES}
    if not any(scores.values()):
        return ""
    names = dict.fromkeys(["top1", *(key for score in scores.values() for key in as_dict(score.get("task_metrics")))])
    output = evaluation.get("top1_output")
    lines = []
    for name in names:
        values = {
            MODES[mode]: value
            for mode, score in scores.items()
            if is_number(value := as_dict(score.get("task_metrics")).get(name, score.get(name)))
        }
        if values:
            title = TASK_TITLES.get(name, name) + (f" on {output}" if isinstance(output, str) else "")
            lines.append(f"{title}: " + ", ".join(f"{mode} {_format_metric(value)}" for mode, value in values.items()))
    return "\n".join(lines) or "top-1: not measured (the evaluation data has no labels)"


def _clip_search(search: Any) -> str:
    if not isinstance(search, dict) or not (candidates := as_list(search.get("candidates"))):
        return ""
    kept = "the MSE threshold (mse)" if search.get("clip") == "mse" else _format_percentile(search.get("chosen"))
    tried = ", ".join(
        f"{'mse' if candidate.get('clip') == 'mse' else _format_percentile(candidate.get('percentile'))} "
        f"{_format_metric(candidate.get('sqnr_db'))}"
        for candidate in map(as_dict, candidates)
    )
    samples = search.get("samples")
    return f"clip search on {samples} samples kept {kept}\n  worst output SQNR dB per candidate: {tried}"


def _layers(analysis: dict[str, Any]) -> str:
    layers = sorted(
        (layer for layer in map(as_dict, as_list(analysis.get("layers"))) if layer.get("node")),
        key=lambda layer: layer["rank"] if is_number(layer.get("rank")) else float("inf"),
    )
    if not layers:
        return ""
    statement = as_dict(analysis.get("layerwise")).get("statement")
    lines = [f"layers ranked by harm ({statement})" if isinstance(statement, str) else "layers ranked by harm"]
    table = [["rank", "node", "op", "SQNR dB alone", "cosine alone"]]
    for layer in layers[:WORST_LAYERS]:
        analyzed = layer.get("analyzed") is not False
        table.append(
            [
                _format_metric(layer.get("rank")),
                str(layer["node"]),
                str(layer.get("op_type") or "-"),
                _format_metric(layer.get("sqnr_db")) if analyzed else "not analyzed",
                _format_metric(layer.get("cosine")) if analyzed else "",
            ]
        )
    lines.append(_table(table))
    if len(layers) > WORST_LAYERS:
        lines.append(f"  ... and {len(layers) - WORST_LAYERS} more (--json for all)")
    return "\n".join(lines)


def _target_steps(target: dict[str, Any]) -> str:
    steps = [as_dict(step) for step in as_list(target.get("steps"))]
    if not steps:
        return ""
    table = [["step", "float layers", str(target.get("metric") or "value"), "met", "top-1", "QDQ size"]]
    for step in steps:
        names = [str(name) for name in as_list(step.get("float_layers"))]
        table.append(
            [
                _format_metric(step.get("step")),
                ", ".join(names[:3]) + (f" +{len(names) - 3}" if len(names) > 3 else "") if names else "none",
                _format_metric(step.get("value")),
                "yes" if step.get("met") else "no",
                _format_metric(step.get("top1")),
                _format_bytes(step["qdq_bytes"]) if is_number(step.get("qdq_bytes")) else "-",
            ]
        )
    chosen = f", step {target['chosen_step']} kept" if is_number(target.get("chosen_step")) else ""
    return f"accuracy target steps ({target.get('search') or 'search'}{chosen})\n" + _table(table)


def _reconstruction(reconstruction: dict[str, Any]) -> str:
    blocks = [as_dict(block) for block in as_list(reconstruction.get("blocks"))]
    if not blocks:
        return ""
    counts: dict[str, int] = {}
    for block in blocks:
        counts[str(block.get("status"))] = counts.get(str(block.get("status")), 0) + 1
    tally = ", ".join(f"{count} {status.replace('_', ' ')}" for status, count in counts.items())
    return f"reconstruction ({reconstruction.get('method')}, {reconstruction.get('iters')} steps per block): {tally}"


def _sizes(model: dict[str, Any]) -> str:
    fp32, qdq = model.get("fp32_bytes"), model.get("qdq_bytes")
    if not (is_number(fp32) and is_number(qdq)):
        return ""
    ratio = f" ({qdq / fp32:.0%} of FP32)" if fp32 else ""
    return f"model size: FP32 {_format_bytes(fp32)}, QDQ {_format_bytes(qdq)}{ratio}"


def _latency(cpu: Any) -> str:
    """The CPU benchmark (``latency.cpu``): per model and batch, p50/p90/p99 and throughput."""
    if not isinstance(cpu, dict):
        return ""
    rows = [["model", "batch", "p50 ms", "p90 ms", "p99 ms", "samples/s"]]
    for model in ("fp32", "quantized"):
        for key, summary in as_dict(cpu.get(model)).items():
            if isinstance(summary, dict):
                rows.append(
                    [
                        model,
                        str(key).removeprefix("batch_"),
                        *(_format_metric(summary.get(f"p{q}_ms")) for q in (50, 90, 99)),
                        _format_metric(summary.get("throughput_samples_per_s")),
                    ]
                )
    if len(rows) == 1:
        return ""
    speedups = ", ".join(
        f"batch {str(key).removeprefix('batch_')}: {value:.2f}x"
        for key, value in as_dict(cpu.get("speedup_p50")).items()
        if is_number(value)
    )
    lines = [f"CPU latency ({cpu.get('provider', 'ONNX Runtime')}):", _table(rows)]
    if speedups:
        lines.append(f"speed-up of the quantized model at p50: {speedups}")
    lines += [f"  note: {note}" for note in as_list(cpu.get("notes"))]
    return "\n".join(lines)


def _stage_times(stages: dict[str, Any]) -> str:
    timed = [f"{name} {_format_seconds(value)}" for name, value in stages.items() if is_number(value)]
    return "time per stage: " + ", ".join(timed) if timed else ""


def _engine(engine: Any) -> str:
    if not isinstance(engine, dict):
        return ""
    reason = engine.get("reason")
    return f"TensorRT engine: {engine.get('status', 'unknown')}" + (f" ({reason})" if isinstance(reason, str) else "")


def _warnings(report: dict[str, Any]) -> str:
    # The annotation's warnings are often repeated among the report's own: each is shown once.
    warnings = dict.fromkeys(
        str(warning)
        for warning in [*as_list(report.get("warnings")), *as_list(as_dict(report.get("annotation")).get("warnings"))]
    )
    if not warnings:
        return ""
    return "\n".join([f"warnings ({len(warnings)}):", *(f"  - {warning}" for warning in warnings)])


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _format_metric(value: Any) -> str:
    if is_number(value):
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    return "-"


def _format_percentile(value: Any) -> str:
    # every digit counts: 99.999 and 100 are different candidates
    return f"p{value:g}" if is_number(value) else "p-"


def _format_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def _format_seconds(value: float) -> str:
    return f"{value:.3g} s"
