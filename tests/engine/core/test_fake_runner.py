"""The scripted fake model runner (engine/core/fake_runner.py)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.fake_runner import ScriptedModelRunner
from engine.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.scripted import script, vocab

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
