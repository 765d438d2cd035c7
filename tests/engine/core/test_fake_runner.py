"""The scripted fake model runner (engine/core/fake_runner.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from contract.scripted import script, vocab
from contract.scripted.script import ScriptState
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput

pytestmark = pytest.mark.timeout(60)


def test_partial_prefill_samples_nothing(factories: Any) -> None:
    f = factories
    core = f.create_core(max_num_batched_tokens=16, max_num_seqs=2)
    run = f.run_workload(core, [f.make_request("A", f.prompt(100, 40), 3, ignore_eos=True)])
    assert [t.num_scheduled_tokens["A"] for t in run.traces] == [16, 16, 8, 1, 1]
    assert [len(t.sampled_token_ids.get("A", ())) for t in run.traces] == [0, 0, 1, 1, 1]
    core = f.create_core(max_num_batched_tokens=16, max_num_seqs=2)
    run = f.run_workload(core, f.create_requests(2, 20, 2))
    assert run.step(1).num_scheduled_tokens == {"r0": 16}
    assert run.step(1).sampled_token_ids == {}
    assert run.step(2).num_scheduled_tokens == {"r0": 4, "r1": 12}
    assert run.step(2).sampled_token_ids.keys() == {"r0"}


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_min_tokens_masks_eos_like_upstream(factories: Any, ignore_eos: bool) -> None:
    f = factories
    prompt = [vocab.BOS, vocab.number(2)]  # " 2" counts down to " 0" then EOS
    request = f.make_request("A", prompt, 10, min_tokens=6, ignore_eos=ignore_eos)
    run = f.run_workload(f.create_core(), [request])
    want = script.expected(prompt, 10, min_tokens=6, ignore_eos=ignore_eos)
    assert run.tokens["A"] == want
    assert vocab.EOS not in want[:6]
    if not ignore_eos:
        assert want[-1] == vocab.EOS and run.finish == {"A": "stop"}


def test_min_tokens_masks_stop_token_ids(factories: Any) -> None:
    f = factories
    prompt = [vocab.BOS, vocab.number(3)]
    stop = [vocab.number(1)]
    request = f.make_request("A", prompt, 8, min_tokens=3, stop_token_ids=stop)
    run = f.run_workload(f.create_core(), [request])
    assert run.tokens["A"] == script.expected(prompt, 8, min_tokens=3, stop_token_ids=stop)
    unmasked = f.run_workload(
        f.create_core(), [f.make_request("B", prompt, 8, stop_token_ids=stop)]
    )
    assert unmasked.tokens["B"] == [vocab.number(2), vocab.number(1)]
    assert unmasked.step(2).stop_reasons == {"B": vocab.number(1)}


def test_runner_rebuilds_resumed_state(factories: Any) -> None:
    f = factories
    core = f.create_core(num_blocks=4, max_model_len=48)
    runner = core.runner
    assert isinstance(runner, ScriptedModelRunner)
    a = f.make_request("A", f.prompt(100, 10), 16, ignore_eos=True)
    b = f.make_request("B", f.prompt(200, 10), 16, ignore_eos=True)
    core.add_request(a)
    core.add_request(b)
    for _ in range(17):
        core.step()
    assert "A" not in runner.requests  # finished at step 16, dropped at step 17
    state = runner.requests["B"]
    assert state.block_ids == core.scheduler.kv_cache_manager.get_block_ids("B") == [2, 3]
    assert state.tokens == b.all_token_ids and state.num_computed_tokens == 17


def test_runner_checks_block_table_covers_tokens(factories: Any) -> None:
    runner = ScriptedModelRunner(script, block_size=4)
    params = factories.make_params(4)
    output = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData("A", [1, 2, 3, 4, 5], params, [1], 0)],
        scheduled_cached_reqs=CachedRequestData(),
        num_scheduled_tokens={"A": 5},
        total_num_scheduled_tokens=5,
        finished_req_ids=set(),
    )
    with pytest.raises(AssertionError, match="cannot hold 5 tokens"):
        runner.execute_model(output)


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
    """The script without ``ScriptState``: the runner must ask with the whole context."""

    def __init__(self) -> None:
        self.calls = 0

    def next_token(self, context: Sequence[int]) -> int:
        self.calls += 1
        return script.next_token(context)

    def ranked(self, context: Sequence[int]) -> list[int]:
        self.calls += 1
        return script.ranked(context)


def _preempting_workload(f: Any, script_: Any) -> tuple[EngineCore, Any, dict[str, int]]:
    """Tight KV, chunked prefill, min_tokens and stop ids: preemptions and resumptions."""
    cfg = f.create_config(max_num_batched_tokens=32, max_num_seqs=8)
    core = EngineCore(cfg, ScriptedModelRunner(script_, block_size=cfg.block_size), 12)
    requests = [
        f.make_request(f"r{i}", f.prompt(10 + 40 * i, 20 + 3 * i), 40, ignore_eos=True)
        for i in range(5)
    ]
    countdown = [vocab.BOS, vocab.number(9)]
    requests.append(f.make_request("m", countdown, 30, min_tokens=12))
    requests.append(f.make_request("s", countdown, 30, stop_token_ids=[vocab.number(4)]))
    prompt_lens = {r.request_id: len(r.prompt_token_ids) for r in requests}
    run = f.run_workload(core, [(i % 3, r) for i, r in enumerate(requests)], 2000)
    return core, run, prompt_lens


def test_runner_asks_the_script_incrementally(factories: Any) -> None:
    counting, whole = _CountingScript(), _WholeContextScript()
    core, run, prompt_lens = _preempting_workload(factories, counting)
    assert run.traces == _preempting_workload(factories, script)[1].traces
    assert run.traces == _preempting_workload(factories, whole)[1].traces
    assert run.finish.keys() == prompt_lens.keys()
    countdown = [vocab.BOS, vocab.number(9)]
    assert run.tokens["m"] == script.expected(countdown, 30, min_tokens=12)
    assert run.tokens["s"] == script.expected(countdown, 30, stop_token_ids=[vocab.number(4)])
    resumes = [r for t in run.traces for r in t.scheduled_resumed_req_ids]
    assert resumes, "the workload must preempt and resume"
    core.step()  # the finished requests' states are dropped at the next step
    assert core.runner.requests == {}  # type: ignore[attr-defined]
    # One state per request plus at most one rebuild per resumption; a state is fed each
    # token once, so pushes are linear in the tokens, while the whole-context script is asked
    # once per sampled token with all of them.
    assert len(prompt_lens) <= counting.built <= len(prompt_lens) + len(resumes)
    final_lens = {r: prompt_lens[r] + len(run.tokens[r]) for r in prompt_lens}
    assert counting.pushed <= sum(n * (1 + resumes.count(r)) for r, n in final_lens.items())
    assert whole.calls >= sum(len(tokens) for tokens in run.tokens.values())


def test_runner_keeps_state_when_an_unscheduled_request_is_resent(factories: Any) -> None:
    # The spec's S14 (0.32 semantics): A self-preempts at step 4 and the running loop breaks,
    # so B is not scheduled; at step 5 B's tokens are re-sent (not resumed): its state stays.
    f = factories
    counting = _CountingScript()
    cfg = f.create_config(max_model_len=64, scheduling_policy="priority")
    core = EngineCore(cfg, ScriptedModelRunner(counting, block_size=cfg.block_size), 5)
    a_prompt, b_prompt = [vocab.BOS, *[ord("A")] * 29], [vocab.BOS, *[ord("B")] * 28]
    a = f.make_request("A", a_prompt, 20, ignore_eos=True, priority=1)
    b = f.make_request("B", b_prompt, 20, ignore_eos=True)
    run = f.run_workload(core, [a, (1, b)])
    assert run.step(4).preempted_req_ids == ("A",) and run.step(4).num_scheduled_tokens == {}
    assert run.step(5).num_scheduled_tokens == {"B": 1}
    assert run.step(5).scheduled_running_req_ids == ("B",)
    resumes = [r for t in run.traces for r in t.scheduled_resumed_req_ids]
    assert resumes == ["A"]
    assert counting.built == 3  # A, B, and A again after its resumption
    assert run.tokens["A"] == script.expected(a_prompt, 20, ignore_eos=True)
    assert run.tokens["B"] == script.expected(b_prompt, 20, ignore_eos=True)
