"""Inline SVG charts for the HTML report (pure: each function returns markup).

- ``render_timeline``: a serve-tier scenario's stream timeline. One lane, and exactly one
  ``<g class="series" data-request=... data-target=...>``, per request copy per target. Time is
  ms since the target's run started (``t_send_ms`` + the frame's ``t_ms``). A tick per SSE frame
  that carried a token (other frames: short grey ticks), a line from send to end, a dot for a
  non-streaming body, a red band from the last progress to the verdict for a stall
  (``zero_byte_hang`` / ``mid_stream_stall``), a cross for errors and crashes.
- ``render_step_chart``: a scheduler-tier run: scheduled tokens per step per request (cell
  opacity), preemptions as red bars, finishes as black ticks, the wedge (no progress) shaded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from html import escape

from parity.results import TargetRun
from parity.serve.observe import STALL_OUTCOMES, RequestObservation, frame_has_token
from parity.serve.run import ServeRun

PALETTE = ("#2563eb", "#9333ea", "#059669", "#d97706", "#0891b2", "#be185d")
LABEL_W = 190
PLOT_W = 900
LANE_H = 16
GROUP_GAP = 6
TOP = 24
MAX_STEPS = 600  # steps drawn per run (the rest summarised)
_ERROR_OUTCOMES = ("http_error", "crashed", "disconnected", "timeout")
_NOT_STARTED = ("startup_refused", "startup_timeout")
Scale = Callable[[float], float]  # ms -> x pixel


def target_color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def _q(value: object) -> str:
    return escape(str(value), quote=True)


def _nice_step(span: float, ticks: int = 8) -> float:
    raw = max(span, 1e-9) / ticks
    power = 10 ** math.floor(math.log10(raw))
    for factor in (1, 2, 5, 10):
        if raw <= factor * power:
            return float(factor * power)
    return float(10 * power)


def _ms_label(ms: float) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def _end_ms(obs: RequestObservation) -> float:
    times = [obs.t_end_ms, obs.t_last_byte_ms, *(f.t_ms for f in obs.frames[-1:])]
    return obs.t_send_ms + max((t for t in times if t is not None), default=0.0)


def _lanes(runs: Sequence[ServeRun]) -> list[tuple[str, list[tuple[int, RequestObservation]]]]:
    """Request ids in first-seen order, each with its observation on every target."""
    order: dict[str, list[tuple[int, RequestObservation]]] = {}
    for index, run in enumerate(runs):
        for obs in run.observations:
            order.setdefault(obs.request_id, []).append((index, obs))
    return list(order.items())


def render_timeline(runs: Sequence[ServeRun], *, title: str = "") -> str:
    """The stream timeline of one serve-tier scenario (empty string without observations)."""
    lanes = _lanes(runs)
    if not lanes:
        return ""
    span = max((_end_ms(o) for _rid, items in lanes for _i, o in items), default=0.0)
    span = max(span, 1.0) * 1.04
    n_series = sum(len(items) for _rid, items in lanes)
    height = TOP + n_series * LANE_H + len(lanes) * GROUP_GAP + 30
    width = LABEL_W + PLOT_W + 20

    def x(ms: float) -> float:
        return round(LABEL_W + PLOT_W * ms / span, 1)

    parts = [
        f'<svg class="timeline" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{_q("stream timeline " + title)}">'
    ]
    parts.append(_axis(span, x, height))
    y = TOP
    for _request_id, items in lanes:
        for index, obs in items:
            parts.append(_series(runs[index].target, index, obs, y, x))
            y += LANE_H
        y += GROUP_GAP
    parts.append("</svg>")
    return "".join(parts)


def _axis(span: float, x: Scale, height: int) -> str:
    step = _nice_step(span)
    out = ['<g class="axis">']
    tick = 0.0
    while tick <= span:
        px = x(tick)
        out.append(
            f'<line x1="{px}" y1="{TOP - 6}" x2="{px}" y2="{height - 22}" class="grid"/>'
            f'<text x="{px}" y="{height - 8}" text-anchor="middle">{_ms_label(tick)}</text>'
        )
        tick += step
    out.append(f'<text x="4" y="{height - 8}">time since run start</text></g>')
    return "".join(out)


def _series(target: str, index: int, obs: RequestObservation, y: int, x: Scale) -> str:
    color = target_color(index)
    mid = y + LANE_H / 2
    tokens = sum(1 for f in obs.frames if frame_has_token(f.payload()))
    tip = (
        f"{obs.request_id} on {target}: {obs.outcome} ({obs.detail}); {len(obs.frames)} frames, "
        f"{tokens} token frames"
        + (f", first token at {obs.t_first_token_ms:g} ms" if obs.t_first_token_ms else "")
    )
    out = [
        f'<g class="series" data-request="{_q(obs.request_id)}" data-target="{_q(target)}" '
        f'data-outcome="{_q(obs.outcome)}"><title>{_q(tip)}</title>',
        f'<text class="lane" x="{LABEL_W - 6}" y="{mid + 4}" text-anchor="end">'
        f'{_q(_short(obs.request_id, 14))} · <tspan fill="{color}">{_q(_short(target, 16))}'
        "</tspan></text>",
    ]
    if obs.outcome in _NOT_STARTED:
        out.append(
            f'<text class="refused" x="{LABEL_W + 6}" y="{mid + 4}">'
            f"{_q(obs.outcome.replace('_', ' '))}</text></g>"
        )
        return "".join(out)
    send, end = obs.t_send_ms, _end_ms(obs)
    out.append(
        f'<line class="span" x1="{x(send)}" y1="{mid}" x2="{x(end)}" y2="{mid}" stroke="{color}"/>'
    )
    out.append(_ticks(obs, mid, x, color))
    if obs.outcome in STALL_OUTCOMES:
        out.append(_stall(obs, y, x))
    elif obs.outcome in _ERROR_OUTCOMES:
        px = x(end)
        label = f"{obs.status}" if obs.outcome == "http_error" and obs.status else obs.outcome
        out.append(
            f'<path class="error" d="M{px - 4} {mid - 4}l8 8m0 -8l-8 8"/>'
            f'<text class="mark" x="{px + 7}" y="{mid + 4}">{_q(label)}</text>'
        )
    elif not obs.stream and obs.outcome == "completed":
        out.append(f'<circle class="body" cx="{x(end)}" cy="{mid}" r="3.5" fill="{color}"/>')
    out.append("</g>")
    return "".join(out)


def _ticks(obs: RequestObservation, mid: float, x: Scale, color: str) -> str:
    token_d: list[str] = []
    other_d: list[str] = []
    for frame in obs.frames:
        px = x(obs.t_send_ms + frame.t_ms)
        if frame_has_token(frame.payload()):
            token_d.append(f"M{px} {mid - 6}v12")
        else:
            other_d.append(f"M{px} {mid - 3}v6")
    out = ""
    if token_d:
        out += f'<path class="tokens" stroke="{color}" d="{"".join(token_d)}"/>'
    if other_d:
        out += f'<path class="frames" d="{"".join(other_d)}"/>'
    return out


def _stall(obs: RequestObservation, y: int, x: Scale) -> str:
    stall = obs.stall
    last = stall.t_last_progress_ms if stall else obs.t_last_progress_ms
    verdict = stall.t_verdict_ms if stall else obs.t_end_ms
    start = obs.t_send_ms + (last or 0.0)
    end = obs.t_send_ms + (verdict if verdict is not None else (last or 0.0))
    x0, x1 = x(start), x(end)
    alive = "" if stall is None else (" (server alive)" if stall.server_alive else " (server dead)")
    label = f"{obs.outcome.replace('_', ' ')} {(end - start) / 1000:.1f} s{alive}"
    return (
        f'<rect class="stall" x="{x0}" y="{y + 1}" width="{max(x1 - x0, 2)}" '
        f'height="{LANE_H - 2}"><title>{_q(label)}</title></rect>'
        f'<text class="stall-label" {_label_at(x0, x1)} y="{y + LANE_H - 4}">{_q(label)}</text>'
    )


def _label_at(x0: float, x1: float) -> str:
    """Right of the band when there is room, else inside it (right-aligned)."""
    if x1 + 230 <= LABEL_W + PLOT_W + 20:
        return f'x="{x1 + 4}"'
    return f'x="{max(x1 - 4, x0 + 4)}" text-anchor="end"'


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render_step_chart(run: TargetRun, index: int = 0) -> str:
    """Scheduled tokens per step per request of one scheduler-tier run (empty without steps)."""
    steps = run.steps[:MAX_STEPS]
    if not steps:
        return ""
    requests: dict[str, None] = {}
    for trace in steps:
        for rid in (*trace.num_scheduled_tokens, *trace.preempted_req_ids, *trace.finished):
            requests.setdefault(rid, None)
    rows = {rid: i for i, rid in enumerate(requests)}
    peak = max((n for t in steps for n in t.num_scheduled_tokens.values()), default=1) or 1
    cell = PLOT_W / len(steps)
    row_h = 12
    height = TOP + len(rows) * row_h + 26
    width = LABEL_W + PLOT_W + 20
    color = target_color(index)
    out = [
        f'<svg class="steps" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" data-target="{_q(run.target)}">'
        f'<text x="4" y="14" class="chart-title">{_q(run.target)}: '
        f"{_q(run.summary.describe())}</text>"
    ]
    for rid, row in rows.items():
        out.append(
            f'<text class="lane" x="{LABEL_W - 6}" y="{TOP + row * row_h + 10}" '
            f'text-anchor="end">{_q(_short(rid, 20))}</text>'
        )
    wedge = run.summary.wedge
    if wedge is not None and wedge.step <= len(steps):
        wx = LABEL_W + (wedge.step - 1) * cell
        out.append(
            f'<rect class="wedge" x="{wx:.1f}" y="{TOP - 4}" width="{LABEL_W + PLOT_W - wx:.1f}" '
            f'height="{len(rows) * row_h + 8}"><title>{_q(wedge.describe())}</title></rect>'
        )
    for i, trace in enumerate(steps):
        cx = LABEL_W + i * cell
        for rid, n in trace.num_scheduled_tokens.items():
            opacity = 0.25 + 0.75 * n / peak
            out.append(
                f'<rect x="{cx:.1f}" y="{TOP + rows[rid] * row_h}" width="{max(cell, 1):.1f}" '
                f'height="{row_h - 2}" fill="{color}" fill-opacity="{opacity:.2f}">'
                f"<title>step {trace.step}: {_q(rid)} {n} tokens</title></rect>"
            )
        for rid in trace.preempted_req_ids:
            out.append(
                f'<rect class="preempt" x="{cx:.1f}" y="{TOP + rows[rid] * row_h - 1}" '
                f'width="{max(cell, 2):.1f}" height="{row_h}"><title>step {trace.step}: '
                f"{_q(rid)} preempted</title></rect>"
            )
        for rid, reason in trace.finished.items():
            out.append(
                f'<rect class="finish" x="{cx + max(cell, 1) - 1:.1f}" '
                f'y="{TOP + rows[rid] * row_h}" width="2" height="{row_h - 2}">'
                f"<title>step {trace.step}: {_q(rid)} finished ({_q(reason)})</title></rect>"
            )
    more = len(run.steps) - len(steps)
    note = f" (first {len(steps)} of {len(run.steps)} steps)" if more > 0 else ""
    out.append(
        f'<text x="{LABEL_W}" y="{height - 6}">step 1 … {len(steps)}{note}; '
        f"peak {peak} tokens/step</text></svg>"
    )
    return "".join(out)
