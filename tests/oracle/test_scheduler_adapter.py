"""The pinned upstream Scheduler, driven by oracle.scheduler_adapter with the scripted runner.

Expected numbers come from docs/upstream-behaviour.md and docs/oracle-on-cpu.md; token streams come
from ``contract.scripted.script.expected``; where a number is derived from the spec's reasoning
the derivation is written next to it. Steps are 1-based (``StepTrace.step``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Sequence
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from contract.scripted import script, vocab
from contract.scripted.script import ScriptState
from contract.trace import StepTrace

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(120)]

WEDGE_PROMPT = [vocab.BOS, vocab.ANSWER_SELECTOR_BASE + 20, vocab.THINK_SELECTOR_BASE + 3]


@pytest.fixture(scope="module")
def adapter() -> ModuleType:
    """oracle.scheduler_adapter, imported once for the module (vllm import ~10-16 s)."""
    return importlib.import_module("oracle.scheduler_adapter")


def _run(adapter: ModuleType, requests: list[dict[str, Any]], max_steps: int, config: dict):
    return adapter.run(requests, max_steps, **config)


# -- the port's wedge and its controls (docs/oracle-on-cpu.md, "Scheduler tier") -------------


def test_port_wedge_bs16_four_blocks(adapter, make_config, make_request, trace_tools) -> None:
    assert WEDGE_PROMPT == [389, 444, 400]
    config = make_config(4, 2048)
    request = make_request("r1", WEDGE_PROMPT, 56, ignore_eos=True)
    traces = _run(adapter, [request], 300, config)

    assert len(traces) == 300  # never finishes: the bound ends the run
    tokens = trace_tools.tokens(traces, "r1")
    assert len(tokens) == 46  # 3 + 45 = 48 slots = 3 usable blocks of 16
    assert tokens == script.expected(WEDGE_PROMPT, 56, ignore_eos=True)[:46]
    # Step 47 needs slot 49, a 4th block: the sole running request preempts itself.
    # (docs/oracle-on-cpu.md's "preemption at step 46" counts steps from 0.)
    assert trace_tools.steps(traces, lambda t: bool(t.preempted_req_ids)) == [47]
    assert traces[46].preempted_req_ids == ("r1",)
    assert trace_tools.steps(traces, lambda t: not t.is_idle) == list(range(1, 47))
    assert sum(t.is_idle for t in traces) == 254
    last = traces[-1]
    assert (last.running, last.waiting) == ((), ("r1",))
    assert last.num_computed_tokens == {"r1": 0}
    assert last.num_free_blocks == 3 and last.block_ids == {}
    assert not any(t.finished for t in traces)


@pytest.mark.parametrize(("num_blocks", "block_size"), [(5, 16), (4, 32)])
def test_wedge_controls_finish_in_56_steps(
    adapter, make_config, make_request, trace_tools, num_blocks: int, block_size: int
) -> None:
    config = make_config(num_blocks, 2048, block_size=block_size)
    traces = _run(adapter, [make_request("r1", WEDGE_PROMPT, 56, ignore_eos=True)], 300, config)
    assert len(traces) == 56
    assert trace_tools.tokens(traces, "r1") == script.expected(WEDGE_PROMPT, 56, ignore_eos=True)
    assert traces[-1].finished == {"r1": "length"} and traces[-1].stop_reasons == {"r1": None}
    assert not any(t.preempted_req_ids for t in traces)
    assert traces[-1].num_free_blocks == num_blocks - 1 and traces[-1].running == ()


# -- spec scenarios ------------------------------------------------------------------------------


def test_s9_self_preemption_and_recovery(adapter, make_config, make_request, trace_tools) -> None:
    a_prompt = [vocab.BOS, *range(ord("A"), ord("A") + 9)]
    b_prompt = [vocab.BOS, *range(ord("a"), ord("a") + 9)]
    requests = [
        make_request("A", a_prompt, 16, ignore_eos=True),
        make_request("B", b_prompt, 16, ignore_eos=True),
    ]
    traces = _run(adapter, requests, 100, make_config(4, 48))
    by_step = {t.step: t for t in traces}

    first = by_step[1]
    assert first.num_scheduled_tokens == {"A": 10, "B": 10}
    assert first.scheduled_new_req_ids == ("A", "B")
    assert first.block_ids == {"A": (1,), "B": (2,)} and first.num_free_blocks == 1
    for step in range(2, 8):
        assert by_step[step].num_scheduled_tokens == {"A": 1, "B": 1}
        assert by_step[step].num_computed_tokens == {"A": step + 9, "B": step + 9}

    eighth = by_step[8]  # slot 17 needs a second block; B is running[-1] and preempts itself
    assert eighth.num_scheduled_tokens == {"A": 1}
    assert eighth.preempted_req_ids == ("B",)
    assert eighth.block_ids == {"A": (1, 3)} and eighth.waiting == ("B",)
    assert len(trace_tools.tokens(traces[:8], "B")) == 7
    for step in range(9, 17):
        assert by_step[step].scheduled_resumed_req_ids == ()
        assert by_step[step].num_scheduled_tokens == {"A": 1}
    assert by_step[16].finished == {"A": "length"} and by_step[16].num_free_blocks == 3

    resume = by_step[17]  # 16-token prefix hit on B's own block 2; 1 token recomputed
    assert resume.scheduled_resumed_req_ids == ("B",)
    assert resume.num_scheduled_tokens == {"B": 1}
    assert resume.block_ids == {"B": (2, 3)} and resume.num_computed_tokens == {"B": 17}
    assert len(traces) == 25 and traces[-1].finished == {"B": "length"}
    assert trace_tools.tokens(traces, "A") == script.expected(a_prompt, 16, ignore_eos=True)
    assert trace_tools.tokens(traces, "B") == script.expected(b_prompt, 16, ignore_eos=True)


def test_s12_chunked_prefill_budget(adapter, make_config, make_request, trace_tools) -> None:
    a_prompt = [vocab.BOS, *range(ord("A"), ord("A") + 19)]
    b_prompt = [vocab.BOS, *range(ord("a"), ord("a") + 19)]
    requests = [make_request("A", a_prompt, 4), make_request("B", b_prompt, 4)]
    config = make_config(100, 64, max_num_batched_tokens=32, max_num_seqs=2)
    traces = _run(adapter, requests, 50, config)

    assert traces[0].num_scheduled_tokens == {"A": 20, "B": 12}
    assert set(traces[0].sampled_token_ids) == {"A"}  # B's partial chunk samples nothing
    assert traces[0].block_ids == {"A": (1, 2), "B": (3,)}
    assert traces[1].num_scheduled_tokens == {"A": 1, "B": 8}
    assert set(traces[1].sampled_token_ids) == {"A", "B"}
    assert traces[1].block_ids["B"] == (3, 4)
    assert trace_tools.tokens(traces, "A") == script.expected(a_prompt, 4)
    assert trace_tools.tokens(traces, "B") == script.expected(b_prompt, 4)


def test_s14_priority_self_preemption_breaks_at_032(
    adapter, make_config, make_request, trace_tools
) -> None:
    requests = [
        make_request("A", [vocab.BOS, *[ord("A")] * 29], 20, ignore_eos=True, priority=1),
        make_request("B", [vocab.BOS, *[ord("B")] * 28], 20, ignore_eos=True, at_step=1),
    ]
    traces = _run(adapter, requests, 100, make_config(5, 64, scheduling_policy="priority"))
    assert traces[0].scheduled_new_req_ids == ("A",)
    assert traces[1].scheduled_new_req_ids == ("B",) and traces[1].running == ("A", "B")
    # Step 4: A (priority 1) needs a third block, is the max-priority victim and preempts
    # itself; 0.32.0 breaks out of the running loop, so B is not scheduled (0.33 would be).
    assert traces[3].preempted_req_ids == ("A",)
    assert traces[3].num_scheduled_tokens == {}
    assert traces[4].num_scheduled_tokens == {"B": 1}
    assert {t.step: t.finished for t in traces if t.finished} == {
        22: {"B": "length"},
        len(traces): {"A": "length"},
    }


def test_preemption_order_within_one_step(adapter, make_config, make_request) -> None:
    # A's third 32-token chunk needs 2 blocks with none free: FCFS preempts running[-1] = C,
    # still short, then B. Upstream reports a set; the trace keeps the order.
    requests = [
        make_request("A", [vocab.BOS, *[ord("A")] * 95], 1),
        make_request("B", [vocab.BOS, 66, 67, 68], 8, ignore_eos=True),
        make_request("C", [vocab.BOS, 69, 70, 71], 8, ignore_eos=True),
    ]
    config = make_config(7, 256, long_prefill_token_threshold=32)
    traces = _run(adapter, requests, 60, config)
    assert traces[2].num_scheduled_tokens == {"A": 32}
    assert traces[2].preempted_req_ids == ("C", "B")
    assert traces[2].waiting == ("B", "C")  # each preempted request goes to the front
    assert traces[2].finished == {"A": "length"}
    assert {r for t in traces for r in t.finished} == {"A", "B", "C"}


# -- stop conditions -----------------------------------------------------------------------------


def test_min_tokens_masks_early_eos(adapter, make_config, make_request, trace_tools) -> None:
    prompt = [vocab.BOS, vocab.ANSWER_SELECTOR_BASE + 2]  # the script answers " 1 0</s>"
    plain = _run(adapter, [make_request("r", prompt, 16)], 50, make_config(50, 256))
    assert trace_tools.tokens(plain, "r") == [vocab.number(1), vocab.number(0), vocab.EOS]
    assert plain[-1].finished == {"r": "stop"} and plain[-1].stop_reasons == {"r": None}

    masked = _run(adapter, [make_request("r", prompt, 16, min_tokens=6)], 50, make_config(50, 256))
    tokens = trace_tools.tokens(masked, "r")
    assert tokens == script.expected(prompt, 16, min_tokens=6)
    assert tokens == [vocab.number(1), vocab.number(0), *[vocab.UM] * 4, vocab.EOS]
    assert masked[-1].finished == {"r": "stop"} and len(masked) == 7


def test_min_tokens_masks_eos_even_with_ignore_eos(
    adapter, make_config, make_request, trace_tools
) -> None:
    prompt = [vocab.BOS, vocab.ANSWER_SELECTOR_BASE + 2]
    request = make_request("r", prompt, 6, min_tokens=4, ignore_eos=True)
    traces = _run(adapter, [request], 50, make_config(50, 256))
    tokens = trace_tools.tokens(traces, "r")
    assert tokens == script.expected(prompt, 6, min_tokens=4, ignore_eos=True)
    assert tokens[2:4] == [vocab.UM, vocab.UM] and tokens[4] == vocab.EOS
    assert traces[-1].finished == {"r": "length"}


def test_stop_token_ids_set_stop_reason(adapter, make_config, make_request, trace_tools) -> None:
    prompt = [vocab.BOS, vocab.ANSWER_SELECTOR_BASE + 5]  # " 4 3 2 1 0</s>"
    stop = vocab.number(2)
    traces = _run(
        adapter, [make_request("r", prompt, 16, stop_token_ids=[stop])], 50, make_config(50, 256)
    )
    assert trace_tools.tokens(traces, "r") == [vocab.number(4), vocab.number(3), stop]
    assert traces[-1].finished == {"r": "stop"} and traces[-1].stop_reasons == {"r": stop}

    # Under min_tokens the stop id is masked like EOS (all_stop_token_ids).
    request = make_request("r", prompt, 16, min_tokens=4, stop_token_ids=[stop])
    traces = _run(adapter, [request], 50, make_config(50, 256))
    tokens = trace_tools.tokens(traces, "r")
    assert tokens == script.expected(prompt, 16, min_tokens=4, stop_token_ids=[stop])
    assert stop not in tokens[:4] and traces[-1].finished == {"r": "stop"}


# -- configs, requests, traces -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("num_blocks", "max_model_len", "refused", "fragment", "effective"),
    [
        (4, 64, True, "the estimated maximum model length is 48", 64),  # S1
        (5, 64, False, None, 64),  # S2
        (4, "auto", False, None, 48),  # S3: auto-fit to 3 usable blocks
        (1, 64, True, "No available memory for the cache blocks", 64),  # S4
        (2, 16, False, None, 16),
        (2, 17, True, "the estimated maximum model length is 16", 17),
        (4, 2048, True, "the estimated maximum model length is 48", 2048),  # the port's wedge
    ],
)
def test_startup_check_matches_spec(
    adapter, make_config, num_blocks, max_model_len, refused, fragment, effective
) -> None:
    oracle = adapter.OracleScheduler(make_config(num_blocks, max_model_len), script=script)
    try:
        check = oracle.startup
        assert check.refused is refused
        assert (check.error is None) is (fragment is None)
        if fragment is not None:
            assert fragment in check.error and "\n" not in check.error
        assert check.max_model_len == effective == oracle.max_model_len
    finally:
        oracle.close()


def test_accepts_engine_config_like_object(adapter, make_config, make_request) -> None:
    fields = make_config(5, 2048)
    engine_config = SimpleNamespace(**fields, seed=0, dtype="float32")
    traces = adapter.run([make_request("r1", WEDGE_PROMPT, 3)], 10, engine_config)
    assert len(traces) == 3 and traces[-1].finished == {"r1": "length"}
    plain = adapter.OracleScheduler(**fields)
    as_object = adapter.OracleScheduler(engine_config)
    assert plain.built is as_object.built  # the VllmConfig is cached per config
    assert plain.scheduler is not as_object.scheduler
    plain.close()
    as_object.close()


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"num_gpu_blocks_override": None}, "num_gpu_blocks_override is required"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy must be fcfs or priority"),
        ({"max_num_seqs": 300, "max_num_batched_tokens": 256}, "must be greater than or equal"),
        ({"max_model_len": 100000}, "greater than the derived max_model_len"),
        ({"model": "/nonexistent"}, "no config.json"),
    ],
)
def test_config_errors_are_one_line(adapter, make_config, overrides, fragment) -> None:
    config = make_config(10, 256)
    config.update(overrides)
    with pytest.raises(adapter.OracleConfigError) as info:
        adapter.OracleScheduler(**config)
    assert fragment in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(adapter.OracleConfigError, match="unknown scheduler-tier config keys"):
        adapter.OracleScheduler(**make_config(10, 256), swap_space=4)


def test_requests_get_deterministic_arrival_and_model_eos(adapter, make_config) -> None:
    with adapter.OracleScheduler(make_config(10, 256)) as oracle:
        for i, request_id in enumerate(["x", "y", "z"]):
            oracle.add_request(request_id, WEDGE_PROMPT, 4, priority=2 - i)
        requests = oracle.scheduler.requests
        assert [requests[r].arrival_time for r in "xyz"] == [0.0, 1.0, 2.0]
        params = requests["x"].sampling_params
        assert params.eos_token_id == vocab.EOS == 390
        assert vocab.EOS in params.all_stop_token_ids
        with pytest.raises(adapter.OracleRequestError, match="duplicate request_id 'x'"):
            oracle.add_request("x", WEDGE_PROMPT, 4)
        with pytest.raises(adapter.OracleRequestError, match="min_tokens"):
            oracle.add_request("w", WEDGE_PROMPT, 4, min_tokens=5)
        # The input processor's prompt-length checks (the engine core never sees these).
        with pytest.raises(adapter.OracleRequestError, match="cannot be empty"):
            oracle.add_request("w", [], 4)
        with pytest.raises(adapter.OracleRequestError, match=r"\(length 257\) is longer than"):
            oracle.add_request("w", [vocab.BOS] * 257, 4)
        with pytest.raises(adapter.OracleRequestError, match="at least 1"):
            oracle.add_request("w", [vocab.BOS] * 256, 4)
        oracle.add_request("w", [vocab.BOS] * 255, 4)


def test_step_traces_round_trip_through_json(adapter, make_config, make_request) -> None:
    requests = [
        make_request("A", [vocab.BOS, *range(65, 74)], 16, ignore_eos=True),
        make_request("B", [vocab.BOS, *range(97, 106)], 16, ignore_eos=True),
        make_request(
            "C", [vocab.BOS, vocab.ANSWER_SELECTOR_BASE + 4], 8, stop_token_ids=[vocab.number(2)]
        ),
    ]
    traces = _run(adapter, requests, 100, make_config(4, 48))
    assert any(t.preempted_req_ids for t in traces)
    assert {r: s for t in traces for r, s in t.stop_reasons.items()} == {
        "A": None,
        "B": None,
        "C": 258,
    }
    for trace in traces:
        again = StepTrace.from_json(json.loads(trace.dumps()))
        assert again == trace
        assert again.dumps() == trace.dumps()


# -- the fake runner's script state --------------------------------------------------------------


class _CountingScript:
    """A script that can only be asked incrementally; counts state builds and pushed tokens."""

    def __init__(self) -> None:
        self.built = 0
        self.pushed = 0
        counter = self

        class CountingState(ScriptState):
            def __init__(self) -> None:
                super().__init__()
                counter.built += 1

            def push(self, token_id: int) -> None:
                counter.pushed += 1
                super().push(token_id)

        self.ScriptState = CountingState

    def next_token(self, context: Sequence[int]) -> int:
        raise AssertionError(f"asked with the whole context ({len(context)} tokens)")

    def ranked(self, context: Sequence[int]) -> list[int]:
        raise AssertionError(f"asked with the whole context ({len(context)} tokens)")


class _WholeContextScript:
    """The script without ``ScriptState``: the adapter must ask with the whole context."""

    def __init__(self) -> None:
        self.calls = 0

    def next_token(self, context: Sequence[int]) -> int:
        self.calls += 1
        return script.next_token(context)

    def ranked(self, context: Sequence[int]) -> list[int]:
        self.calls += 1
        return script.ranked(context)


def _preempting_requests(make_request) -> list[dict[str, Any]]:
    countdown = [vocab.BOS, vocab.number(9)]
    requests = [
        make_request(
            f"r{i}",
            [vocab.BOS, *range(10 + 40 * i, 29 + 43 * i)],
            40,
            ignore_eos=True,
            at_step=i % 3,
        )
        for i in range(5)
    ]
    requests.append(make_request("m", countdown, 30, min_tokens=12, at_step=2))
    requests.append(make_request("s", countdown, 30, stop_token_ids=[vocab.number(4)]))
    return requests


def test_runner_asks_the_script_incrementally(
    adapter, make_config, make_request, trace_tools
) -> None:
    requests = _preempting_requests(make_request)
    config = make_config(12, 2048, max_num_batched_tokens=32, max_num_seqs=8)
    counting, whole = _CountingScript(), _WholeContextScript()
    traces = adapter.run(requests, 2000, config, script=counting)
    assert traces == adapter.run(requests, 2000, config, script=script)
    assert traces == adapter.run(requests, 2000, config, script=whole)
    finished = {r for t in traces for r in t.finished}
    assert finished == {r["id"] for r in requests}
    for request in requests:
        want = script.expected(
            request["prompt_token_ids"],
            request["max_tokens"],
            min_tokens=request["min_tokens"],
            ignore_eos=request["ignore_eos"],
            stop_token_ids=request["stop_token_ids"],
        )
        assert trace_tools.tokens(traces, request["id"]) == want
    resumes = [r for t in traces for r in t.scheduled_resumed_req_ids]
    assert resumes, "the workload must preempt and resume"
    # One state per request plus at most one rebuild per resumption, each fed a token once.
    assert len(requests) <= counting.built <= len(requests) + len(resumes)
    final_lens = {
        r["id"]: len(r["prompt_token_ids"]) + len(trace_tools.tokens(traces, r["id"]))
        for r in requests
    }
    assert counting.pushed <= sum(n * (1 + resumes.count(r)) for r, n in final_lens.items())
    assert whole.calls >= sum(len(t.sampled_token_ids) for t in traces)


def test_runner_keeps_state_of_a_running_request_and_drops_finished(
    adapter, make_config, make_request
) -> None:
    # S14 at 0.32: A self-preempts at step 4 and B is not scheduled; B stays running (its
    # state is kept), A is resumed (its state is rebuilt).
    counting = _CountingScript()
    config = make_config(5, 64, scheduling_policy="priority")
    with adapter.OracleScheduler(config, script=counting) as oracle:
        oracle.add_request("A", [vocab.BOS, *[ord("A")] * 29], 20, ignore_eos=True, priority=1)
        traces = [oracle.step()]
        oracle.add_request("B", [vocab.BOS, *[ord("B")] * 28], 20, ignore_eos=True)
        while oracle.has_unfinished_requests():
            traces.append(oracle.step())
        assert traces[3].preempted_req_ids == ("A",) and traces[4].num_scheduled_tokens == {"B": 1}
        assert [r for t in traces for r in t.scheduled_resumed_req_ids] == ["A"]
        assert counting.built == 3  # A, B, and A again after its resumption
        assert oracle._script_states.keys() <= {"A", "B"}
        oracle.step()  # finished requests reach the runner with the next schedule()
        assert oracle._script_states == {}
