"""The report as one standalone HTML page a user can attach to a review: no scripts, no external
assets (styles inline, the per-layer chart an inline SVG), every value from the report escaped.

Sections: summary (platform, precision, top-1, sizes), the accuracy target's verdict and every step, QAT's
outcome and held-out SQNR per epoch (``quantcore.report.curve``), output metrics per measured mode, the
CPU latency benchmark, the layers ranked by harm (chart of the layer-wise SQNR of the ``CHART_LAYERS``
most harmful, then the full table), the tensors' range statistics, warnings. Wide tables fit a 1366 px
window: their headers are words that wrap.
``render_html(report)`` takes the JSON-ready dict ``quantize`` writes as report.json.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from quantcore.report.curve import line_chart

HTML_FILE = "report.html"
CHART_LAYERS = 30
BAR_HEIGHT, LABEL_WIDTH, PLOT_WIDTH = 18, 320, 420  # px
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;color:#1f2937;margin:2rem auto;max-width:1100px;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #d1d5db}
table{border-collapse:collapse;margin:.5rem 0;font-size:13px}
th,td{border:1px solid #d1d5db;padding:2px 8px;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f4f6}
.ok{color:#047857;font-weight:600}.fail{color:#be123c;font-weight:600}code{font-size:12px}
.note{color:#4b5563}table.fit{width:100%}table.fit code{overflow-wrap:anywhere}
"""
# evaluation.<mode>.outputs[name] metric → column header
OUTPUT_COLUMNS = {
    "sqnr_db": "SQNR (dB)",
    "cosine": "cosine",
    "max_abs_error": "max abs error",
    "mean_abs_error": "mean abs error",
    "relative_error_p50": "relative error p50",
    "relative_error_p90": "relative error p90",
    "relative_error_p99": "relative error p99",
    "argmax_agreement": "argmax agreement",
    "exact_match": "exact match",
}


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "—"
    return str(value)


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[Any]], *, code_columns: Iterable[int] = (), fit: bool = False
) -> str:
    code = set(code_columns)
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            text = _e(_fmt(value))
            if i in code:
                cells.append(f"<td><code>{text}</code></td>")
            else:
                numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
                cells.append(f'<td class="n">{text}</td>' if numeric else f"<td>{text}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    table = '<table class="fit">' if fit else "<table>"
    return f"{table}<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def layer_chart(layers: Sequence[Mapping[str, Any]]) -> str:
    """Inline SVG: one horizontal bar per layer (ranked order), length = layer-wise SQNR (dB), the lowest
    (most harmful) on top; layers without a finite SQNR are left out."""
    rows = [r for r in layers if isinstance(r.get("sqnr_db"), (int, float))][:CHART_LAYERS]
    if not rows:
        return '<p class="note">No layer-wise SQNR to chart.</p>'
    top = max(max(r["sqnr_db"] for r in rows), 1.0)
    height = BAR_HEIGHT * len(rows) + 30
    width = LABEL_WIDTH + PLOT_WIDTH + 60
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
        f'aria-label="Layer-wise SQNR in dB, most harmful layer first">'
    ]
    for i, row in enumerate(rows):
        y = i * BAR_HEIGHT
        length = max(0.0, row["sqnr_db"]) / top * PLOT_WIDTH
        name = str(row["node"])
        shown = name if len(name) <= 48 else "…" + name[-47:]
        parts.append(
            f'<text x="{LABEL_WIDTH - 6}" y="{y + 13}" text-anchor="end" font-size="11">{_e(shown)}</text>'
            f'<rect x="{LABEL_WIDTH}" y="{y + 3}" width="{length:.1f}" height="{BAR_HEIGHT - 6}" fill="#be123c">'
            f"<title>{_e(name)}: {row['sqnr_db']:.2f} dB</title></rect>"
            f'<text x="{LABEL_WIDTH + length + 4:.1f}" y="{y + 13}" font-size="11">{row["sqnr_db"]:.1f}</text>'
        )
    axis_y = BAR_HEIGHT * len(rows) + 18
    parts.append(
        f'<text x="{LABEL_WIDTH}" y="{axis_y}" font-size="11">0 dB</text>'
        f'<text x="{LABEL_WIDTH + PLOT_WIDTH}" y="{axis_y}" font-size="11" text-anchor="end">{top:.1f} dB</text></svg>'
    )
    return "".join(parts)


def _summary(report: Mapping[str, Any]) -> str:
    config = report.get("config") or {}
    evaluation = report.get("evaluation") or {}
    model = evaluation.get("model") or {}
    rows = [
        ("platform", config.get("platform")),
        ("precision", config.get("precision")),
        ("observer", config.get("observer")),
        ("evaluated samples", evaluation.get("num_samples")),
        ("FP32 size (bytes)", model.get("fp32_bytes")),
        ("quantized size (bytes)", model.get("qdq_bytes")),
    ]
    for mode in ("fp32", "qdq_exact", "qdq_deployed"):
        for name, value in ((evaluation.get(mode) or {}).get("task_metrics") or {}).items():
            rows.append((f"{name} · {mode}", value))
    return _table(["", "value"], rows)


def _deployment(report: Mapping[str, Any]) -> str:
    """The parity verdict: does the model run as measured, what was changed, and how to run it so."""
    parity = report.get("parity")
    if not parity:
        return ""
    agree = parity.get("agree")
    verdict_class = "ok" if agree else "fail" if agree is False else "note"
    html = f'<h2>Deployment</h2><p class="{verdict_class}">{_e(parity.get("reason"))}</p>'
    if parity.get("remedy"):
        html += f"<p>What was changed: {_e(parity['remedy'])}</p>"
    disabled = (report.get("config") or {}).get("disabled_optimizers") or []
    if disabled:
        call = f"onnxruntime.InferenceSession(path, disabled_optimizers={list(disabled)!r})"
        html += f"<p>Run it as measured: <code>{_e(call)}</code></p>"
    return html


def _target(target: Mapping[str, Any] | None) -> str:
    if not target:
        return ""
    verdict_class = "ok" if target.get("met") else "fail"
    steps = _table(
        [
            "step",
            "layers in float",
            target.get("metric", "metric"),
            "met",
            "top-1",
            "size (bytes)",
            "ms/sample",
            "calibration",
        ],
        (
            [
                s["step"],
                s["float_layers"],
                s["value"],
                s["met"],
                s["top1"],
                s["qdq_bytes"],
                s["latency_ms_per_sample"],
                s["calibration"],
            ]
            for s in target.get("steps", [])
        ),
    )
    return (
        f"<h2>Accuracy target: {_e(target.get('statement'))}</h2>"
        f'<p class="{verdict_class}">{_e(target.get("verdict"))}</p>'
        f'<p class="note">Measured on {_e(target.get("measured_on"))}; {_e(target.get("search"))}.</p>{steps}'
    )


def _mixed_precision(section: Mapping[str, Any] | None) -> str:
    """The layers mixed precision promoted, with what each tensor became, and its steps."""
    if not section:
        return ""
    verdict_class = "ok" if section.get("met") else "fail"
    promoted = _table(
        ["layer", "op", "layer-wise SQNR (dB)", "tensors"],
        (
            [p["layer"], p["op_type"], p["layer_sqnr_db"], ", ".join(f"{t}: {to}" for t, to in p["tensors"].items())]
            for p in section.get("promoted", [])
        ),
    )
    metric = (section.get("objective") or {}).get("metric", "metric")
    steps = _table(
        ["layers promoted", metric, "calibration", "seconds"],
        ([s["layers"], s["value"], s["calibration"], s["seconds"]] for s in section.get("steps", [])),
    )
    return (
        f'<h2>Mixed precision</h2><p class="{verdict_class}">{_e(section.get("statement"))}</p>'
        f'<p class="note">Measured on {_e(section.get("measured_on"))}.</p>{promoted}{steps}'
    )


def _qat(section: Mapping[str, Any] | None) -> str:
    """QAT's outcome, the training loss and the held-out SQNR per epoch as charts (epoch 0: the post-training
    model, which has a held-out SQNR but no training loss) and a table."""
    if not section:
        return ""
    sqnr = section.get("heldout_sqnr_db") or {}
    curve = section.get("curve") or []
    points = [(0, sqnr.get("before")), *((p["epoch"], p["heldout_sqnr_db"]) for p in curve)]
    status = section.get("status")
    statement = (
        f"{status}: {section['reason']}"
        if section.get("reason")
        else (
            f"{status}: held-out SQNR {_fmt(sqnr.get('before'))} → {_fmt(sqnr.get('after'))} dB, "
            f"epoch {section.get('best_epoch')} kept, {_fmt(section.get('seconds'))} s on {section.get('device')}"
        )
    )
    epochs = _table(
        ["epoch", "steps", "loss", "held-out SQNR (dB)"],
        ([p["epoch"], p["steps"], p["loss"], p["heldout_sqnr_db"]] for p in curve),
    )
    return (
        f'<h2>Quantization-aware training</h2><p class="{"ok" if status == "trained" else "note"}">{_e(statement)}</p>'
        f"{line_chart([(p['epoch'], p['loss']) for p in curve], label='Training loss per epoch', unit='')}"
        f"{line_chart(points, label='Held-out SQNR per epoch', unit='dB')}{epochs}"
    )


def _outputs(evaluation: Mapping[str, Any]) -> str:
    rows = []
    for mode in ("qdq_exact", "qdq_deployed"):
        for output, metrics in ((evaluation.get(mode) or {}).get("outputs") or {}).items():
            rows.append([mode, output, *(metrics.get(k) for k in OUTPUT_COLUMNS)])
    headers = ["measured as", "output", *OUTPUT_COLUMNS.values()]
    return "<h2>Outputs: quantized vs FP32</h2>" + _table(headers, rows, code_columns=[1], fit=True)


def _rounded(value: float | None) -> int | None:
    return None if value is None else round(value)


def _latency(latency: Mapping[str, Any] | None) -> str:
    """The CPU benchmark (``latency.cpu``): FP32 against quantized, per batch size."""
    cpu = (latency or {}).get("cpu")
    if not cpu:
        return '<h2>Latency</h2><p class="note">Not measured: the run turned the CPU latency benchmark off.</p>'
    rows = []
    for batch in cpu.get("batch_sizes", []):
        fp32, quantized = cpu["fp32"].get(f"batch_{batch}", {}), cpu["quantized"].get(f"batch_{batch}", {})
        speedup = cpu["speedup_p50"].get(f"batch_{batch}")
        rows.append(
            [
                batch,
                fp32.get("p50_ms"),
                quantized.get("p50_ms"),
                f"{speedup:.2f}\u00d7" if speedup is not None else None,
                quantized.get("p90_ms"),
                quantized.get("p99_ms"),
                *(_rounded(stats.get("throughput_samples_per_s")) for stats in (fp32, quantized)),
            ]
        )
    headers = [
        "batch",
        "FP32 p50 ms",
        "quantized p50 ms",
        "speed-up (p50)",
        "quantized p90 ms",
        "quantized p99 ms",
        "FP32 samples/s",
        "quantized samples/s",
    ]
    setup = (
        f"{cpu.get('provider')} (ONNX Runtime {cpu.get('onnxruntime')}) on {cpu.get('device')} · "
        f"threads: {cpu.get('threads') or 'default'} · warm-up runs: {cpu.get('warmup')} · "
        f"timed runs: up to {cpu.get('runs')}."
    )
    notes = "".join(f"<li>{_e(note)}</li>" for note in cpu.get("notes") or [])
    return f'<h2>Latency</h2><p class="note">{_e(setup)}</p>{_table(headers, rows)}' + (
        f'<ul class="note">{notes}</ul>' if notes else ""
    )


def _analysis(analysis: Mapping[str, Any] | None) -> str:
    if not analysis:
        return ""
    layers = analysis.get("layers", [])
    layer_table = _table(
        ["rank", "node", "op", "layer-wise SQNR (dB)", "cosine", "local SQNR (dB)", "quantized tensors"],
        (
            [r["rank"], r["node"], r["op_type"], r["sqnr_db"], r["cosine"], r["local_sqnr_db"], r["tensors"]]
            for r in layers
        ),
        code_columns=[1, 6],
    )
    tensor_table = _table(
        [
            "tensor",
            "kind",
            "graph-wise SQNR (dB)",
            "local SQNR (dB)",
            "observed min",
            "observed max",
            "range min",
            "range max",
            "clipped",
            "channel range ratio",
        ],
        (
            [
                t["tensor"],
                t["kind"],
                t["graphwise_sqnr_db"],
                t["local_sqnr_db"],
                t["observed_min"],
                t["observed_max"],
                t["range_min"],
                t["range_max"],
                t["clipped_fraction"],
                t["channel_range_ratio"],
            ]
            for t in analysis.get("tensors", [])
        ),
        code_columns=[0],
    )
    statement = (analysis.get("layerwise") or {}).get("statement", "")
    return (
        "<h2>Layers ranked by harm</h2>"
        f'<p class="note">Output SQNR with only that layer quantized ({_e(statement)}); lowest = most harmful.</p>'
        f"{layer_chart(layers)}{layer_table}"
        "<h2>Quantized tensors</h2>"
        '<p class="note">Graph-wise: SQNR at the tensor in the fully quantized model; local: its own '
        "quantization alone; clipped: fraction of values beyond the chosen range.</p>"
        f"{tensor_table}"
    )


def render_html(report: Mapping[str, Any]) -> str:
    """The whole page (UTF-8 text) for a report dict as written to report.json."""
    config = report.get("config") or {}
    title = f"Quantization report · {config.get('platform', '')} {config.get('precision', '')}".strip()
    warnings = report.get("warnings") or []
    warning_list = "".join(f"<li>{_e(w)}</li>" for w in warnings)
    return (
        f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{_e(title)}</h1>"
        f"{_summary(report)}{_deployment(report)}{_target(report.get('target'))}{_qat(report.get('qat'))}"
        f"{_mixed_precision(report.get('mixed_precision'))}"
        f"{_outputs(report.get('evaluation') or {})}"
        f"{_latency(report.get('latency'))}"
        f"{_analysis(report.get('analysis'))}"
        + (f"<h2>Warnings</h2><ul>{warning_list}</ul>" if warnings else "")
        + f'<p class="note">Report format {_e(report.get("format"))}.</p></body></html>\n'
    )
