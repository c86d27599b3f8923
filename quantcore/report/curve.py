"""A line chart as inline SVG, for the report page: one value per step (QAT's held-out SQNR per epoch),
no scripts, every label escaped."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

WIDTH, HEIGHT, MARGIN = 420, 160, 36  # px: the plot area is (WIDTH - 2·MARGIN) x (HEIGHT - 2·MARGIN)


def line_chart(points: Sequence[tuple[float, float | None]], *, label: str, unit: str) -> str:
    """``points`` (x, y) joined in order, y None or non-finite left out; the y axis spans the finite
    values' range (a flat line sits mid-height). Empty string when fewer than two points remain."""
    kept = [(x, y) for x, y in points if y is not None and math.isfinite(y)]
    if len(kept) < 2:
        return ""
    xs, ys = [x for x, _ in kept], [y for _, y in kept]
    x_span, y_low, y_span = (max(xs) - min(xs)) or 1.0, min(ys), (max(ys) - min(ys)) or 0.0

    def at(x: float, y: float) -> tuple[float, float]:  # px, y growing downwards
        fraction = 0.5 if y_span == 0 else (y - y_low) / y_span
        left = MARGIN + (x - min(xs)) / x_span * (WIDTH - 2 * MARGIN)
        return left, HEIGHT - MARGIN - fraction * (HEIGHT - 2 * MARGIN)

    name, units = html.escape(label, quote=True), html.escape(unit)
    pixels = [at(x, y) for x, y in kept]
    dots = "".join(
        f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="#1d4ed8"><title>{x:g}: {y:.2f} {units}</title></circle>'
        for (x, y), (px, py) in zip(kept, pixels, strict=True)
    )
    line = " ".join(f"{px:.1f},{py:.1f}" for px, py in pixels)
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{name}">'
        f'<polyline fill="none" stroke="#1d4ed8" stroke-width="2" points="{line}"/>{dots}'
        f'<text x="{MARGIN}" y="{HEIGHT - 8}" font-size="11">{min(xs):g}</text>'
        f'<text x="{WIDTH - MARGIN}" y="{HEIGHT - 8}" font-size="11" text-anchor="end">{max(xs):g}</text>'
        f'<text x="4" y="{MARGIN - 12}" font-size="11">{max(ys):.2f} {units}</text>'
        f'<text x="4" y="{HEIGHT - MARGIN + 14}" font-size="11">{y_low:.2f} {units}</text></svg>'
    )
