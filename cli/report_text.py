"""The human summary of a job report (`quantctl jobs report ID`; `--json` prints the raw report).

The report's layout is the worker's business and may still move, so this module does not index it
by fixed paths. It walks the whole document and picks out:

- metric blocks: any object holding a known metric (`sqnr_db`, `cosine`, `max_abs_error`, ...).
  A block under a `layer`/`tensor`/`node` key is a per-layer figure; the others are per-output
  figures, labelled by mode (`exact_qdq`/`qdq_exact`, `deployed`/`qdq_deployed`, `fp32`) and output
  name however deep they sit, so `{"evaluation": {"qdq_exact": {"outputs": {"logits": {...}}}}}` and
  `{"outputs": {"logits": {"exact_qdq": {...}}}}` both render as "exact QDQ  logits". A block that
  holds only task metrics (`top1`, `top5`) is a task-metric line, one value per mode;
- sizes (keys ending in `bytes`, or under `size`), latencies (under a `latency` key) and stage
  times (keys with `seconds`);
- `engine` (status and reason) and every `warnings` list.

Whatever is missing is left out; nothing here raises on an unexpected shape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

METRICS = {
    "sqnr_db": "SQNR dB",
    "cosine": "cosine",
    "max_abs_error": "max abs err",
    "mean_abs_error": "mean abs err",
    "argmax_agreement": "argmax agree",
    "exact_match": "exact match",
    "top1": "top-1",
    "top5": "top-5",
}
TASK_METRICS = {"top1", "top5"}
MODES = {
    "fp32": "FP32",
    "exact_qdq": "exact QDQ",
    "qdq_exact": "exact QDQ",
    "deployed": "deployed",
    "qdq_deployed": "deployed",
    "engine": "engine",
}
# Path components that only group things and add nothing to a label.
NOISE = {"evaluation", "outputs", "metrics", "task_metrics", "report", "results", "per_output", "model"}
LAYER_HINTS = ("layer", "tensor", "node")
SIZE_KEYS = {"size", "sizes"}
# Subtrees whose numbers are settings, not measurements (`config.batch_size`).
SKIP_FIGURES = {"recipe", "config", "settings", "calibration"}
WORST_LAYERS = 5

Path = tuple[str, ...]
Block = tuple[Path, dict[str, Any]]


def render_report(report: Any) -> str:
    if not isinstance(report, dict):
        return f"report: {report!r}"
    blocks = list(_metric_blocks(report, ()))
    layers = [(path, block) for path, block in blocks if _is_layer(path)]
    outputs = [(path, block) for path, block in blocks if not _is_layer(path)]
    per_output = [(path, block) for path, block in outputs if set(block) & (set(METRICS) - TASK_METRICS)]
    task = [(path, block) for path, block in outputs if not set(block) & (set(METRICS) - TASK_METRICS)]
    sections = [
        _header(report),
        _outputs_table(per_output),
        _task_metrics(task, report),
        _layers_summary(layers),
        # Sizes of the models; the engine's build settings (workspace_bytes...) are not sizes of anything.
        _figures("sizes", _find({k: v for k, v in report.items() if k != "engine"}, _is_size_key), _format_bytes),
        _latency(report.get("latency")),
        _figures("time per stage", _find(report, _is_seconds_key), _format_seconds),
        _engine(report.get("engine")),
        _warnings(_find_lists(report, "warnings")),
    ]
    text = "\n\n".join(section for section in sections if section)
    return text or "the report holds nothing this client knows how to summarize (try --json)"


def _metric_blocks(node: Any, path: Path) -> Iterator[Block]:
    if isinstance(node, dict):
        if any(key in METRICS for key in node):
            yield path, node
        for key, value in node.items():
            if key not in METRICS:
                yield from _metric_blocks(value, (*path, str(key)))
    elif isinstance(node, list):
        for index, item in enumerate(node):
            name = (item.get("name") or item.get("output") or item.get("tensor")) if isinstance(item, dict) else None
            yield from _metric_blocks(item, (*path, str(name) if name else str(index)))


def _is_layer(path: Path) -> bool:
    return any(hint in part.lower() for part in path for hint in LAYER_HINTS)


def _label(path: Path) -> tuple[str, str]:
    """(mode, rest): `("evaluation", "qdq_deployed", "outputs", "logits")` → ("deployed", "logits")."""
    mode = next((MODES[part] for part in path if part in MODES), "")
    rest = [part for part in path if part not in MODES and part not in NOISE]
    return mode, "/".join(rest)


def _mode_rank(path: Path) -> int:
    """FP32 first, then exact QDQ, deployed, engine; unlabelled blocks last."""
    order = list(dict.fromkeys(MODES.values()))
    mode = _label(path)[0]
    return order.index(mode) if mode in order else len(order)


def _header(report: dict[str, Any]) -> str:
    config = report.get("config") if isinstance(report.get("config"), dict) else {}
    fields = [
        f"{key}: {value}"
        for key in ("job_id", "platform", "precision", "observer")
        if isinstance(value := report.get(key, config.get(key)), str | int | float)
    ]
    lines = ["  ".join(fields)] if fields else []
    evaluation = report.get("evaluation") if isinstance(report.get("evaluation"), dict) else {}
    if _is_number(samples := evaluation.get("num_samples")):
        lines.append(f"evaluated on {samples} held-out samples")
    return "\n".join(lines)


def _outputs_table(blocks: list[Block]) -> str:
    if not blocks:
        return ""
    columns = [key for key in METRICS if any(key in block for _, block in blocks)]
    rows = [["mode", "output", *(METRICS[key] for key in columns)]]
    for path, block in sorted(blocks, key=lambda item: (_mode_rank(item[0]), _label(item[0])[1])):
        mode, output = _label(path)
        rows.append([mode or "-", output or "-", *(_format_metric(block.get(key)) for key in columns)])
    return "per-output error, quantized vs FP32\n" + _table(rows)


def _task_metrics(blocks: list[Block], report: dict[str, Any]) -> str:
    lines = []
    evaluation = report.get("evaluation") if isinstance(report.get("evaluation"), dict) else {}
    output = evaluation.get("top1_output")
    for key in sorted(TASK_METRICS):
        # a figure stated twice under one label (`fp32.top1` and `fp32.task_metrics.top1`) is shown once
        values: dict[tuple[str, str], Any] = {}
        for path, block in sorted(blocks, key=lambda b: _mode_rank(b[0])):
            if key in block:
                values.setdefault(_label(path), block[key])
        if values:
            title = METRICS[key] + (f" on {output}" if isinstance(output, str) else "")
            joined = ", ".join(
                f"{mode or rest or 'all'} {_format_metric(value)}" for (mode, rest), value in values.items()
            )
            lines.append(f"{title}: {joined}")
    return "\n".join(lines)


def _layers_summary(blocks: list[Block]) -> str:
    if not blocks:
        return ""
    lines = [f"per-layer analysis: {len(blocks)} entries"]
    ranked = sorted(
        ((block["sqnr_db"], path) for path, block in blocks if _is_number(block.get("sqnr_db"))),
        key=lambda item: item[0],
    )
    if ranked:
        lines.append(f"lowest SQNR ({min(WORST_LAYERS, len(ranked))}):")
        lines += [f"  {value:8.2f} dB  {path[-1] if path else '-'}" for value, path in ranked[:WORST_LAYERS]]
    return "\n".join(lines)


def _find(node: Any, match: Callable[[Path], bool], path: Path = (), depth: int = 4) -> list[tuple[Path, Any]]:
    """Numbers (or maps of numbers) at paths that `match`, outside layer subtrees and settings."""
    found: list[tuple[Path, Any]] = []
    if not isinstance(node, dict) or depth == 0 or _is_layer(path) or (path and path[-1] in SKIP_FIGURES):
        return found
    for key, value in node.items():
        key_path = (*path, str(key))
        if match(key_path) and (_is_number(value) or _is_number_map(value)):
            found.append((key_path, value))
        elif isinstance(value, dict) and str(key) not in METRICS:
            found += _find(value, match, key_path, depth - 1)
    return found


def _find_lists(node: Any, name: str, depth: int = 3) -> list[Any]:
    """The items of every list under a key called `name`, a few levels deep."""
    if not isinstance(node, dict) or depth == 0:
        return []
    found: list[Any] = []
    for key, value in node.items():
        if key == name and isinstance(value, list):
            found += value
        else:
            found += _find_lists(value, name, depth - 1)
    return found


def _figures(title: str, found: list[tuple[Path, Any]], fmt: Callable[[float], str]) -> str:
    """One line per number; a map of numbers spreads over lines. Labels drop grouping keys."""
    flat: list[tuple[Path, Any]] = []
    for path, value in found:
        flat += (
            [((*path, str(k)), number) for k, number in value.items()] if isinstance(value, dict) else [(path, value)]
        )
    if not flat:
        return ""
    lines = [f"{title}:"]
    for path, value in flat:
        kept = [part for part in path[:-1] if part not in SIZE_KEYS | NOISE and not _is_grouping(part)]
        label = ".".join([*kept, path[-1]]) if path else title
        lines.append(f"  {label}: {fmt(value)}")
    return "\n".join(lines)


def _is_grouping(part: str) -> bool:
    return part in {"latency", "stage_seconds", "seconds"}


def _latency(latency: Any) -> str:
    """The CPU latency table (``latency.cpu``: per model and batch, p50/p90/p99 and throughput), else
    any ``*_ms`` figures found under ``latency``."""
    cpu = latency.get("cpu") if isinstance(latency, dict) else None
    if not isinstance(cpu, dict) or not isinstance(cpu.get("fp32"), dict):
        found = _find(latency, lambda path: path[-1].endswith("_ms")) if isinstance(latency, dict) else []
        return _figures("latency", found, _format_ms)
    rows = [["model", "batch", "p50 ms", "p90 ms", "p99 ms", "samples/s"]]
    for model in ("fp32", "quantized"):
        for key, summary in (cpu.get(model) or {}).items():
            if isinstance(summary, dict):
                rows.append(
                    [
                        model,
                        key.removeprefix("batch_"),
                        *(_format_metric(summary.get(f"p{q}_ms")) for q in (50, 90, 99)),
                        _format_metric(summary.get("throughput_samples_per_s")),
                    ]
                )
    speedups = ", ".join(
        f"batch {key.removeprefix('batch_')}: {value:.2f}x"
        for key, value in (cpu.get("speedup_p50") or {}).items()
        if _is_number(value)
    )
    lines = [f"CPU latency ({cpu.get('provider', 'ONNX Runtime')}):", _table(rows)]
    if speedups:
        lines.append(f"speed-up of the quantized model at p50: {speedups}")
    lines += [f"  note: {note}" for note in cpu.get("notes") or []]
    return "\n".join(lines)


def _engine(engine: Any) -> str:
    if isinstance(engine, str):
        return f"engine: {engine}"
    if not isinstance(engine, dict):
        return ""
    status = engine.get("status", "built" if engine.get("path") or engine.get("artifact") else "unknown")
    reason = engine.get("reason") or engine.get("error")
    return f"engine: {status}" + (f" ({reason})" if reason else "")


def _warnings(warnings: list[Any]) -> str:
    if not warnings:
        return ""
    lines = [f"warnings ({len(warnings)}):"]
    for warning in warnings:
        if isinstance(warning, dict):
            warning = warning.get("message") or ", ".join(f"{k}={v}" for k, v in warning.items())
        lines.append(f"  - {warning}")
    return "\n".join(lines)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _format_metric(value: Any) -> str:
    if value is None:
        return "-"
    if _is_number(value):
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    if isinstance(value, dict):
        return " -> ".join(f"{key} {_format_metric(number)}" for key, number in value.items())
    return str(value)[:40]


def _format_bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB"):
        if abs(value) < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} GiB"


def _format_ms(value: float) -> str:
    return f"{value:.3g} ms"


def _format_seconds(value: float) -> str:
    return f"{value:.3g} s"


def _is_size_key(path: Path) -> bool:
    """`*_bytes`, or anything directly under `size`/`sizes`."""
    return path[-1].endswith("bytes") or path[-1] in SIZE_KEYS or (len(path) > 1 and path[-2] in SIZE_KEYS)


def _is_seconds_key(path: Path) -> bool:
    return any("seconds" in part for part in path)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_number_map(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(_is_number(v) for v in value.values())
