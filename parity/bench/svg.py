"""Self-contained SVG bar charts for the benchmark report (no scripts, fonts or network).

``grouped_bars`` draws one group per category (a load, a workload) with one bar per series
(engine, oracle), each bar labelled with its value; a missing value leaves a gap marked "n/a".
Upstream: none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from xml.sax.saxutils import escape

COLORS = {"engine": "#1f77b4", "oracle": "#ff7f0e"}
FALLBACK_COLORS = ("#2ca02c", "#d62728", "#9467bd", "#8c564b")
WIDTH = 720
HEIGHT = 340
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 50, 60


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    magnitude = 10 ** len(str(int(value))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * magnitude:
            return step * magnitude
    return value


def grouped_bars(
    title: str,
    unit: str,
    categories: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    note: str = "",
) -> str:
    """An SVG document: ``series[name][i]`` is the bar of ``name`` in ``categories[i]``."""
    values = [v for vs in series.values() for v in vs if v is not None]
    top = _nice_max(max(values, default=0.0))
    plot_w = WIDTH - LEFT - RIGHT
    plot_h = HEIGHT - TOP - BOTTOM
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="15" '
        f'font-weight="bold">{escape(title)}</text>',
    ]
    if note:
        out.append(f'<text x="{WIDTH / 2}" y="37" text-anchor="middle" fill="#555">'
                   f"{escape(note)}</text>")  # fmt: skip
    for i in range(5):  # grid and y labels
        tick = top * i / 4
        y = TOP + plot_h - plot_h * i / 4
        out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" '
                   f'stroke="#ddd"/>')  # fmt: skip
        out.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_fmt(tick)}</text>')
    out.append(f'<text x="16" y="{TOP + plot_h / 2}" transform="rotate(-90 16 '
               f'{TOP + plot_h / 2})" text-anchor="middle">{escape(unit)}</text>')  # fmt: skip
    names = list(series)
    group_w = plot_w / max(len(categories), 1)
    bar_w = group_w * 0.7 / max(len(names), 1)
    for c, category in enumerate(categories):
        x0 = LEFT + c * group_w + group_w * 0.15
        for s, name in enumerate(names):
            value = series[name][c] if c < len(series[name]) else None
            x = x0 + s * bar_w
            color = COLORS.get(name, FALLBACK_COLORS[s % len(FALLBACK_COLORS)])
            if value is None:
                out.append(f'<text x="{x + bar_w / 2:.1f}" y="{TOP + plot_h - 4}" '
                           f'text-anchor="middle" fill="#999">n/a</text>')  # fmt: skip
                continue
            h = plot_h * value / top
            y = TOP + plot_h - h
            out.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                f'fill="{color}"><title>{escape(name)} {escape(category)}: {_fmt(value)} '
                f"{escape(unit)}</title></rect>"
            )
            out.append(f'<text x="{x + bar_w / 2:.1f}" y="{y - 3:.1f}" text-anchor="middle" '
                       f'font-size="10">{_fmt(value)}</text>')  # fmt: skip
        out.append(f'<text x="{x0 + bar_w * len(names) / 2:.1f}" y="{TOP + plot_h + 18}" '
                   f'text-anchor="middle">{escape(category)}</text>')  # fmt: skip
    out.append(f'<line x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + plot_h}" '
               f'y2="{TOP + plot_h}" stroke="#333"/>')  # fmt: skip
    for s, name in enumerate(names):  # legend
        x = LEFT + s * 110
        y = HEIGHT - 18
        color = COLORS.get(name, FALLBACK_COLORS[s % len(FALLBACK_COLORS)])
        out.append(f'<rect x="{x}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{x + 17}" y="{y}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
