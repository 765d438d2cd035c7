"""``parity run --record``: the reference target's observations become the ``expect:`` block,
edited in place (comments, key order and the rest of the file kept); a recorded file passes and
re-recording changes nothing."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from parity_helpers import SCENARIOS

from parity.cli import EXIT_BAD_INPUT, EXIT_DIVERGENCE, EXIT_OK, main
from parity.errors import ParityError
from parity.loader import load_scenario, parse_scenario
from parity.record import merge, reference_index, serve_expect, write_expect
from parity.serve.expect import check_serve_expect

pytestmark = pytest.mark.timeout(180)

SOURCE = SCENARIOS / "s10-fcfs-victim-newest.yaml"  # a preemption and a resumption


def _without_expect(tmp_path: Path) -> tuple[Path, str]:
    text = SOURCE.read_text(encoding="utf-8")
    head = text[: text.index("\nexpect:") + 1].replace("limits:\n", "# the bounds\nlimits:\n")
    head = head.replace("id: s10-fcfs-victim-newest", "id: recorded  # renamed")
    path = tmp_path / "recorded.yaml"
    path.write_text(head, encoding="utf-8")
    return path, head


def test_record_writes_an_expect_that_passes_and_is_idempotent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, head = _without_expect(tmp_path)
    argv = ["run", str(path), "--tier", "scheduler", "--no-progress"]
    assert main([*argv, "--record"]) == EXIT_OK
    assert "expect: recorded from oracle" in capsys.readouterr().err
    text = path.read_text(encoding="utf-8")
    assert text.startswith(head)  # everything before the block, comments included, unchanged
    scenario = load_scenario(path)
    assert scenario.expect is not None
    steps = scenario.expect.steps
    assert any(s.preempted_req_ids for s in steps.values()), "the preemption step is recorded"
    assert any(s.scheduled_resumed_req_ids for s in steps.values()), "and the resumption"
    assert set(scenario.expect.outcome) == {"A", "B"}
    assert main(argv) == EXIT_OK  # the recorded file passes on both targets
    assert main([*argv, "--record"]) == EXIT_OK
    assert "expect: unchanged" in capsys.readouterr().err
    assert path.read_text(encoding="utf-8") == text  # re-recording is idempotent
    # the recorded values are checked: one changed value fails the run
    step = max(steps)
    changed = text.replace(
        f"finished_at_step: {{A: {scenario.expect.finished_at_step['A']}",
        f"finished_at_step: {{A: {step + 5}",
    )
    assert changed != text
    path.write_text(changed, encoding="utf-8")
    assert main(argv) == EXIT_DIVERGENCE
    # re-recording repairs it and keeps the comments inside the block
    path.write_text(changed.replace("  outcome:", "  # outcomes\n  outcome:"), encoding="utf-8")
    assert main([*argv, "--record"]) == EXIT_OK
    assert path.read_text(encoding="utf-8") == text.replace(
        "  outcome:", "  # outcomes\n  outcome:"
    )


def test_a_bad_record_target_exits_2_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, head = _without_expect(tmp_path)
    argv = ["run", str(path), "--tier", "scheduler", "--no-progress", "--record"]
    assert main([*argv, "--record-target", "nope"]) == EXIT_BAD_INPUT
    assert "--record-target 'nope' is not a target of this run" in capsys.readouterr().err
    assert path.read_text(encoding="utf-8") == head
    assert reference_index(["engine", "oracle"], None) == 1
    assert reference_index(["engine"], None) == 0
    assert reference_index(["engine", "oracle"], "engine") == 0


EDITED = """\
# yaml-language-server: $schema=../schema.json
id: edited
description: d  # kept
tier: scheduler
config: {block_size: 16, num_gpu_blocks_override: 4}
requests:
  - id: r1
    prompt_token_ids: [389, 430]
    max_tokens: 3
expect:
  # per request
  outcome:
    r1: finished  # block style, kept while the value holds
  num_output_tokens: {r1: 9}
  steps:
    2:
      running:
        - r1
# the end
"""


def test_write_expect_edits_in_place(tmp_path: Path) -> None:
    path = tmp_path / "edited.yaml"
    path.write_text(EDITED, encoding="utf-8")
    path.chmod(0o640)
    scenario = load_scenario(path)
    recorded = {
        "outcome": {"r1": "finished"},
        "finish_reason": {"r1": "length"},
        "num_output_tokens": {"r1": 3},
        "steps": {1: {"num_scheduled_tokens": {"r1": 2}}, 2: {"running": ["r1"]}},
    }
    assert write_expect(scenario, recorded)
    text = path.read_text(encoding="utf-8")
    head = EDITED[: EDITED.index("expect:")]
    assert text.startswith(head)
    assert text[len(head) :] == (
        "expect:\n"
        "  # per request\n"
        "  outcome:\n"
        "    r1: finished  # block style, kept while the value holds\n"
        "  finish_reason: {r1: length}\n"
        "  num_output_tokens: {r1: 3}\n"
        "  steps:\n"
        "    1:\n"
        "      num_scheduled_tokens: {r1: 2}\n"
        "    2:\n"
        "      running:\n"
        "        - r1\n"
        "# the end\n"
    )
    assert not write_expect(load_scenario(path), recorded)  # nothing left to change
    assert path.stat().st_mode & 0o777 == 0o640  # the file keeps its mode


def test_write_expect_refuses_what_does_not_load(tmp_path: Path) -> None:
    path = tmp_path / "edited.yaml"
    path.write_text(EDITED, encoding="utf-8")
    with pytest.raises(ParityError, match="the recorded expect: does not load"):
        write_expect(load_scenario(path), {"outcome": {"nobody": "finished"}})
    assert path.read_text(encoding="utf-8") == EDITED


def test_tiers_that_disagree_leave_the_key_out() -> None:
    scheduler = {"outcome": {"r1": "finished"}, "finish_reason": {"r1": "length"}}
    serve = {
        "outcome": {"r1": "completed"},
        "finish_reason": {"r1": "length"},
        "status": {"r1": 200},
    }
    assert merge([scheduler, serve]) == {"finish_reason": {"r1": "length"}, "status": {"r1": 200}}
    idle = {"steps": {47: {"num_scheduled_tokens": {}}}}  # an empty value is a value
    assert merge([idle]) == idle


SERVE = """\
id: served
description: d
tier: serve
requests:
  - id: r1
    prompt: "<|answer:2|>"
    max_tokens: 8
    repeat: 2
"""


def _observed(copy: int, status: int, data: dict[str, object]) -> object:
    """Copy ``copy`` of request r1, answered ``status`` with the JSON body ``data``."""
    from parity.serve.observe import RequestObservation, parse_body

    body = json.dumps(data)
    return RequestObservation(
        request_id=f"r1#{copy}",
        spec_id="r1",
        endpoint="completions",
        stream=False,
        outcome="completed" if status < 400 else "http_error",
        detail="",
        status=status,
        body=body,
        result=parse_body(body, status),
    )


def _observation(copy: int, text: str) -> object:
    choice = {"index": 0, "text": text, "token_ids": [257, 256, 390], "finish_reason": "stop"}
    usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    data = {"id": "c", "object": "text_completion", "created": 1, "model": "scripted"}
    return _observed(copy, 200, {**data, "choices": [choice], "usage": usage})


def _error(copy: int, param: str) -> object:
    error = {"message": "too long", "type": "BadRequestError", "param": param}
    return _observed(copy, 400, {"error": error})


def test_serve_tier_recording_passes_its_own_check(tmp_path: Path) -> None:
    from parity.serve.pool import StartupRecord
    from parity.serve.run import ServeRun, TargetFacts

    path = tmp_path / "served.yaml"
    path.write_text(SERVE, encoding="utf-8")
    scenario = load_scenario(path)
    run = ServeRun(
        target="oracle",
        startup=StartupRecord("oracle", "started", port=1),
        observations=(_observation(0, " 1 0"), _observation(1, " 1 0")),
        facts=TargetFacts(model_id="scripted", max_model_len=96),
    )
    recorded = serve_expect(scenario, run)
    assert (
        recorded is not None
        and recorded["startup"] == "started"
        and recorded["max_model_len"] == 96
    )
    assert recorded["text"] == {"r1": " 1 0"} and recorded["status"] == {"r1": 200}
    assert write_expect(scenario, recorded)
    again = load_scenario(path)
    assert check_serve_expect(again, run) == []
    # copies that differ: that key is not recorded (the others still are)
    uneven = ServeRun(
        target="oracle",
        startup=StartupRecord("oracle", "started", port=1),
        observations=(_observation(0, " 1 0"), _observation(1, " 1")),
    )
    reading = serve_expect(again, uneven)
    assert reading is not None and "text" not in reading
    assert reading["finish_reason"] == {"r1": "stop"}
    timed_out = ServeRun(target="oracle", startup=StartupRecord("oracle", "startup_timeout"))
    assert serve_expect(again, timed_out) is None  # neither started nor refused: nothing
    refused = ServeRun(target="oracle", startup=StartupRecord("oracle", "startup_refused"))
    assert serve_expect(again, refused) == {"startup": "refused"}
    unsupported = replace(run, unsupported="no logprobs")
    assert serve_expect(again, unsupported) is None
    # an HTTP error has no finish_reason or text to record; its status and error.param are
    failed = ServeRun(
        target="oracle",
        startup=StartupRecord("oracle", "started", port=1),
        observations=(_error(0, "max_tokens"), _error(1, "max_tokens")),
    )
    reading = serve_expect(again, failed)
    assert reading is not None and reading["status"] == {"r1": 400}
    assert reading["error_param"] == {"r1": "max_tokens"} and reading["text"] == {"r1": None}
    assert "finish_reason" not in reading and "num_output_tokens" not in reading
    assert write_expect(again, reading)
    assert check_serve_expect(load_scenario(path), failed) == []
    parse_scenario(path.read_text(encoding="utf-8"), str(path), stem="served")


def test_the_readme_example_is_the_bundled_recorded_scenario() -> None:
    readme = (SCENARIOS.parent / "README.md").read_text(encoding="utf-8")
    blocks = [b.split("\n", 1)[1] for b in readme.split("```yaml")[1:]]
    blocks = [b[: b.index("```")] for b in blocks]
    (example,) = [b for b in blocks if b.startswith("# yaml-language-server") and "id:" in b]
    (recorded,) = [b for b in blocks if b.startswith("expect:\n  outcome: {a: finished, b:")]
    bundled = (SCENARIOS / "two-countdowns.yaml").read_text(encoding="utf-8")
    assert example + recorded == bundled, "keep scenarios/README.md and the file in step"
