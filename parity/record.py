"""``parity run --record``: write what the reference target showed as the ``expect:`` block.

Upstream: none; this is the completion mode of sqllogictest for scenario files. The reference
target is the oracle by default (the second target of the run), or ``--record-target``.

What is recorded (``parity.expect`` and ``parity.serve.expect`` check exactly these readings,
so a recorded file passes on the target it was recorded from):

- the keys the ``expect:`` block already has (every request id, step and step field named
  there), with their observed values;
- scheduler tier: per request ``outcome``, ``output_token_ids`` and, when it finished,
  ``finish_reason``, ``stop_reason``, ``finished_at_step``; ``num_preemptions`` when any
  request was preempted; ``wedged_at_step`` when wedged; and every step where a request was
  admitted, resumed, preempted or finished, with ``num_scheduled_tokens``,
  ``num_free_blocks`` and the non-empty ones of ``scheduled_new_req_ids``,
  ``scheduled_resumed_req_ids``, ``preempted_req_ids``, ``finished``;
- serve tier: ``startup``, ``max_model_len``, per request ``outcome``, ``status``,
  ``finish_reason``, ``stop_reason``, ``num_output_tokens``, ``text`` (``reasoning`` with a
  reasoning parser, ``num_choices`` with ``n``, ``error_param`` on an HTTP error). A value that
  differs between the copies of a repeated request is not recorded.

A key both tiers record with different values (a ``tier: both`` scenario) is left out. The
file is edited in place: ruamel's round-trip keeps comments and key order inside ``expect:``,
an unchanged value keeps its spelling, and everything outside the block is kept byte for byte.
The result must load back before it replaces the file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from parity._codec import plain
from parity._roundtrip import dump, round_trip, write_atomic
from parity.errors import ParityError
from parity.results import TargetRun
from parity.scenario import Scenario

Recorded = dict[str, Any]
_EVENT_FIELDS = (
    "scheduled_new_req_ids",
    "scheduled_resumed_req_ids",
    "preempted_req_ids",
    "finished",
)
_STARTUP = {"started": "started", "startup_refused": "refused"}  # StartupRecord.outcome
_DROP = object()  # a key two readings disagree on
_NULLABLE = frozenset({"stop_reason", "error_param", "text", "reasoning"})  # null is a value


def scheduler_expect(scenario: Scenario, run: TargetRun) -> Recorded:
    """The ``expect:`` values of one scheduler-tier run (see the module docstring)."""
    from parity.expect import PER_REQUEST

    old = _existing(scenario)
    summary = run.summary
    out: Recorded = {}
    defaults = {"outcome", "output_token_ids"}
    finished = {"finish_reason", "stop_reason", "finished_at_step"}
    preempted = any(o.num_preemptions for o in summary.outcomes.values())
    for key, attribute in PER_REQUEST.items():
        values = {}
        for request in scenario.requests:
            outcome = summary.outcomes.get(request.id)
            if outcome is None:
                continue
            wanted = (
                key in defaults
                or (key in finished and outcome.outcome == "finished")
                or (key == "num_preemptions" and preempted)
                or request.id in old.get(key, {})
            )
            value = getattr(outcome, attribute)
            if wanted and (value is not None or key in _NULLABLE):
                values[request.id] = plain(value)
        if values:
            out[key] = values
    if summary.wedge is not None or "wedged_at_step" in old:
        out["wedged_at_step"] = summary.wedge.step if summary.wedge is not None else None
    steps: dict[int, Recorded] = {}
    for trace in run.steps:
        names = set(old.get("steps", {}).get(trace.step, {}))
        if any(getattr(trace, name) for name in _EVENT_FIELDS):
            names |= {"num_scheduled_tokens", "num_free_blocks"}
            names |= {name for name in _EVENT_FIELDS if getattr(trace, name)}
        if names:
            steps[trace.step] = {n: plain(getattr(trace, n)) for n in _ordered(names)}
    if steps:
        out["steps"] = steps
    return out


def serve_expect(scenario: Scenario, run: Any) -> Recorded | None:
    """The ``expect:`` values of one serve-tier run (a ``parity.serve.run.ServeRun``); None
    when its server neither started nor refused the config (a timeout: nothing to record) or
    the target could not run the scenario (``unsupported``)."""
    from parity.serve.expect import PER_REQUEST

    startup = _STARTUP.get(run.startup.outcome)
    if startup is None or getattr(run, "unsupported", None) is not None:
        return None
    old = _existing(scenario)
    out: Recorded = {"startup": startup}
    seen = run.startup.numbers
    numbers = {k: seen[k] for k in old.get("startup_numbers", {}) if k in seen}
    if numbers:
        out["startup_numbers"] = numbers
    if not run.startup.started:
        return out
    if run.facts is not None and run.facts.max_model_len is not None:
        out["max_model_len"] = run.facts.max_model_len
    for key, read in PER_REQUEST.items():
        values = {}
        for request in scenario.requests:
            copies = [o for o in run.observations if o.spec_id == request.id]
            if not copies or not (
                _serve_default(key, scenario, request, copies) or (request.id in old.get(key, {}))
            ):
                continue
            readings = [plain(read(o)) for o in copies]
            if readings[0] is None and key not in _NULLABLE:
                continue  # e.g. no finish_reason on an HTTP error: nothing the schema takes
            if all(r == readings[0] for r in readings):
                values[request.id] = readings[0]
        if values:
            out[key] = values
    return out


def _serve_default(key: str, scenario: Scenario, request: Any, copies: list[Any]) -> bool:
    if key in ("outcome", "status", "finish_reason", "stop_reason", "num_output_tokens", "text"):
        return True
    if key == "reasoning":
        return scenario.config.reasoning_parser is not None
    if key == "num_choices":
        return request.n is not None
    if key == "error_param":
        return any((o.status or 0) >= 400 for o in copies)
    return False


def merge(recorded: Iterable[Recorded]) -> Recorded:
    """One ``expect:`` from several tiers' recordings; a value they disagree on is left out."""
    out: Recorded = {}
    for one in recorded:
        _merge_into(out, one)
    return _without_drops(out)


def _merge_into(out: Recorded, new: Recorded) -> None:
    for key, value in new.items():
        if key not in out:
            out[key] = value
        elif isinstance(out[key], dict) and isinstance(value, dict):
            _merge_into(out[key], value)
        elif out[key] != value:
            out[key] = _DROP


def _without_drops(node: Recorded) -> Recorded:
    kept = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            value = _without_drops(value) or _DROP  # emptied by drops: nothing agreed on
        if value is not _DROP:
            kept[key] = value
    return kept


def _existing(scenario: Scenario) -> Recorded:
    if scenario.expect is None:
        return {}
    data = scenario.expect.model_dump(mode="python", exclude_unset=True)
    for step, fields in scenario.expect.steps.items():
        data.setdefault("steps", {})[step] = dict.fromkeys(fields.model_fields_set)
    return data


def _ordered(names: set[str]) -> list[str]:
    from parity.scenario import StepExpect

    return [name for name in StepExpect.model_fields if name in names]


# -- writing ------------------------------------------------------------------------------------


def write_expect(scenario: Scenario, expect: Recorded) -> bool:
    """Make ``expect`` the ``expect:`` block of the scenario's file; True when the file changed."""
    from parity.loader import parse_scenario

    path = Path(scenario.file)
    text = path.read_text(encoding="utf-8")
    yaml = round_trip()
    yaml.width = 4096  # a long list stays on its line (ruamel would wrap it ragged)
    doc = yaml.load(text)
    ordered = _in_schema_order(expect)
    if doc.get("expect") is None:
        doc["expect"] = _node(ordered, depth=0)
    else:
        _update(doc["expect"], ordered, depth=0)
    block = _block(dump(yaml, doc), "expect")
    start = _block_span(text, "expect")
    if start is None:
        out = text + ("" if text.endswith("\n") else "\n") + block
    else:
        out = text[: start[0]] + block + text[start[1] :]
    if out == text:
        return False
    try:
        parse_scenario(out, scenario.file, stem=path.stem)
    except ParityError as exc:
        raise ParityError(f"{scenario.file}: the recorded expect: does not load: {exc}") from None
    write_atomic(path, out)
    return True


def _in_schema_order(expect: Recorded) -> Recorded:
    from parity.scenario import ExpectSpec

    return {key: expect[key] for key in ExpectSpec.model_fields if key in expect}


def _node(value: Any, depth: int) -> Any:
    """A ruamel node for a new value: the expect block and ``steps`` in block style, a step's
    fields, per-request maps of scalars and lists in flow style."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, dict):
        node = CommentedMap((k, _node(v, depth + 1)) for k, v in value.items())
        nested = any(isinstance(v, dict | list) for v in value.values())
        if not (depth == 0 or nested and depth < 3):
            node.fa.set_flow_style()
        return node
    if isinstance(value, list):
        seq = CommentedSeq(_node(v, depth + 1) for v in value)
        seq.fa.set_flow_style()
        return seq
    return value


def _update(node: Any, value: Recorded, depth: int) -> None:
    """Set ``node`` (a ruamel map) to ``value`` in place: equal values keep their spelling and
    comments, a new key goes after the keys recorded before it, keys not recorded are removed."""
    for key in [k for k in node if k not in value]:
        del node[key]
    order = list(value)
    for n, (key, new) in enumerate(value.items()):
        if key not in node:
            before = [k for k in order[:n] if k in node]
            position = list(node).index(before[-1]) + 1 if before else 0
            node.insert(position, key, _node(new, depth + 1))
        elif _plain_node(node[key]) == new:
            continue
        elif isinstance(new, dict) and hasattr(node[key], "items"):
            _update(node[key], new, depth + 1)
        else:
            node[key] = _node(new, depth + 1)


def _plain_node(node: Any) -> Any:
    if hasattr(node, "items"):
        return {k: _plain_node(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain_node(v) for v in node]
    return node


def _top_level_starts(lines: Sequence[str]) -> list[int]:
    return [i for i, ln in enumerate(lines) if ln[:1] not in ("", " ", "\t", "#", "\n", "\r", "-")]


def _block_span(text: str, key: str) -> tuple[int, int] | None:
    """Character span of the top-level ``key:`` block of ``text`` (up to the next top-level
    key, comment lines before it included), or None."""
    lines = text.splitlines(keepends=True)
    starts = _top_level_starts(lines)
    for n, i in enumerate(starts):
        if lines[i].startswith(f"{key}:"):
            end = starts[n + 1] if n + 1 < len(starts) else len(lines)
            offset = sum(len(ln) for ln in lines[:i])
            return offset, offset + sum(len(ln) for ln in lines[i:end])
    return None


def _block(text: str, key: str) -> str:
    span = _block_span(text, key)
    if span is None:  # pragma: no cover - the dumped document always has the key
        raise ParityError(f"no {key}: block in the dumped scenario")
    return text[span[0] : span[1]]


# -- the run ------------------------------------------------------------------------------------


def reference_index(specs: Sequence[str], record_target: str | None) -> int:
    """Which target of the run ``--record`` reads: ``record_target`` (one of ``specs``), else
    the second (the oracle of ``engine`` vs ``oracle``), else the only one."""
    if record_target is None:
        return 1 if len(specs) > 1 else 0
    if record_target not in specs:
        raise ParityError(
            f"--record-target {record_target!r} is not a target of this run ({', '.join(specs)})"
        )
    return list(specs).index(record_target)


def record_run(
    scenarios: Sequence[Scenario],
    results: Sequence[Any],
    traces: dict[str, tuple[TargetRun, ...]],
    specs: Sequence[str],
    record_target: str | None,
) -> list[Any]:
    """Record every scenario of the run from its reference target, print one line per file,
    and return ``results`` with ``expect:`` checked again against the recorded files."""
    import sys

    index = reference_index(specs, record_target)
    by_id: dict[str, list[Any]] = {}
    for result in results:
        by_id.setdefault(result.scenario_id, []).append(result)
    recorded: dict[str, Scenario] = {}
    for scenario in scenarios:
        readings = []
        for result in by_id.get(scenario.id, ()):
            if result.tier == "scheduler":
                run = traces[scenario.id][index]
                if run.summary.started:
                    readings.append(scheduler_expect(scenario, run))
            elif index < len(result.runs):
                reading = serve_expect(scenario, result.runs[index])
                readings += [reading] if reading is not None else []
        if not readings:
            sys.stderr.write(f"{scenario.file}: not recorded ({specs[index]} did not run it)\n")
            continue
        changed = write_expect(scenario, merge(readings))
        state = "recorded" if changed else "unchanged"
        sys.stderr.write(f"{scenario.file}: expect: {state} from {specs[index]}\n")
        from parity.loader import load_scenario

        recorded[scenario.id] = load_scenario(scenario.file)
    return [_rechecked(r, recorded.get(r.scenario_id), traces) for r in results]


def _rechecked(result: Any, scenario: Scenario | None, traces: dict[str, tuple]) -> Any:
    """``result`` with its ``expect:`` failures those of the recorded ``scenario``."""
    import dataclasses

    from parity.expect import check_expect
    from parity.results import Status
    from parity.serve.expect import check_serve_expect

    if scenario is None:
        return result
    failures = []
    if result.tier == "scheduler":
        for run in traces[scenario.id]:
            failures.extend(check_expect(scenario, run))
    else:
        for run in result.runs:
            if run.unsupported is None:  # as parity.serve.suite.judge checks them
                failures.extend(check_serve_expect(scenario, run))
    status, verdict = result.status, result.verdict
    if status is Status.EXPECT_FAILED and not failures:
        status, verdict = Status.PASS, "expect: recorded"
    elif status is Status.PASS and failures:
        first = failures[0]
        status = Status.EXPECT_FAILED
        verdict = f"expect failed on {first.target}: {first.path} ({len(failures)} failures)"
    return dataclasses.replace(
        result, status=status, verdict=verdict, expect_failures=tuple(failures)
    )
