"""Check a scenario's ``expect:`` block against one target's serve-tier run.

Each entry is checked per target, independently of the diff. Request-keyed entries name a
scenario request id and are checked on every copy of it (``id#k`` when repeated):
``outcome`` (``parity.serve.observe.OUTCOMES``), ``status``, ``error_param``,
``finish_reason``, ``stop_reason``, ``num_output_tokens`` (token ids returned, else
``usage.completion_tokens``), ``output_token_ids``, ``text`` (completion text or chat
content; null: none), ``reasoning`` and ``num_choices``. Run-level: ``startup`` (``started`` or ``refused``),
``startup_numbers`` (numbers of the startup log), ``max_model_len`` (``/v1/models``) and
``min_preemptions`` (the ``vllm:num_preemptions`` change over the scenario). Scheduler-only
keys (``finished_at_step``, ``wedged_at_step``, ``steps``, ``num_preemptions``) are ignored.
"""

from __future__ import annotations

from typing import Any

from parity._codec import plain
from parity.results import ExpectFailure
from parity.scenario import Scenario
from parity.serve.observe import RequestObservation
from parity.serve.run import ServeRun

STARTUP_PATH = "expect.startup"


def _num_output_tokens(obs: RequestObservation) -> int | None:
    """The server's own token ids, else its usage count, else the ids derived from the text
    (which miss what never reaches the text, e.g. ``</s>``)."""
    if obs.result.token_ids is not None and not obs.result.token_ids_derived:
        return len(obs.result.token_ids)
    usage = obs.result.usage or {}
    value = usage.get("completion_tokens")
    if isinstance(value, int):
        return value
    return len(obs.result.token_ids) if obs.result.token_ids is not None else None


PER_REQUEST: dict[str, Any] = {
    "outcome": lambda o: o.outcome,
    "status": lambda o: o.status,
    "error_param": lambda o: (o.result.error or {}).get("param"),
    "finish_reason": lambda o: o.result.finish_reason,
    "stop_reason": lambda o: o.result.stop_reason,
    "num_output_tokens": _num_output_tokens,
    "output_token_ids": lambda o: list(o.result.token_ids or ()),
    "text": lambda o: o.result.text,
    "reasoning": lambda o: o.result.reasoning,
    "num_choices": lambda o: o.result.num_choices,
}


def check_serve_expect(scenario: Scenario, run: ServeRun) -> list[ExpectFailure]:
    """Every serve-tier ``expect:`` entry ``run`` does not meet (empty: all hold)."""
    expect = scenario.expect
    if expect is None:
        return []
    failures: list[ExpectFailure] = []

    def check(path: tuple[Any, ...], expected: Any, actual: Any) -> None:
        if plain(expected) != plain(actual):
            failures.append(
                ExpectFailure(
                    run.target,
                    ".".join(str(p) for p in path),
                    plain(expected),
                    plain(actual),
                    scenario.location(path),
                )
            )

    started = "started" if run.startup.started else "refused"
    if expect.startup is not None:
        check(("expect", "startup"), expect.startup, started)
    for name, value in expect.startup_numbers.items():
        check(("expect", "startup_numbers", name), value, run.startup.numbers.get(name))
    if not run.startup.started:
        return failures  # a refusal without expect.startup is a divergence or an error
    if expect.max_model_len is not None:
        advertised = run.facts.max_model_len if run.facts else None
        check(("expect", "max_model_len"), expect.max_model_len, advertised)
    for key, read in PER_REQUEST.items():
        for request_id, expected in getattr(expect, key).items():
            copies = [o for o in run.observations if o.spec_id == request_id]
            if not copies:
                check(("expect", key, request_id), expected, None)
            for obs in copies:
                check(("expect", key, request_id), expected, read(obs))
    if expect.min_preemptions is not None:
        from parity.serve.differ import PREEMPTIONS, metric_deltas

        deltas = metric_deltas(run) or {}
        preempted = deltas.get(PREEMPTIONS)
        if preempted is None or preempted < expect.min_preemptions:
            check(("expect", "min_preemptions"), f">= {expect.min_preemptions}", preempted)
    return failures
