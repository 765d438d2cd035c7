"""Scheduler rules one at a time (engine/core/sched/scheduler.py)."""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.sched.output import SchedulerOutput
from engine.core.step_trace import traced_step
from engine.outputs import ModelRunnerOutput
from engine.request import RequestStatus

pytestmark = pytest.mark.timeout(60)


def _runner_output(output: SchedulerOutput, tokens: dict[str, list[int]]) -> ModelRunnerOutput:
    req_ids = list(output.num_scheduled_tokens)
    return ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={r: i for i, r in enumerate(req_ids)},
        sampled_token_ids=[tokens.get(r, []) for r in req_ids],
    )


def test_chunked_prefill_off_stops_at_the_first_prompt_over_budget(factories: Any) -> None:
    f = factories
    cfg = dict(max_model_len=64, max_num_batched_tokens=64, max_num_seqs=4)
    reqs = [
        f.make_request(r, f.prompt(b, 40), 2, ignore_eos=True) for r, b in (("A", 100), ("B", 200))
    ]
    off = f.create_core(enable_chunked_prefill=False, **cfg)
    run = f.run_workload(off, reqs)
    assert run.step(1).num_scheduled_tokens == {"A": 40}  # B (40 > 24 left) waits whole
    assert run.step(2).num_scheduled_tokens == {"A": 1, "B": 40}
    reqs = [
        f.make_request(r, f.prompt(b, 40), 2, ignore_eos=True) for r, b in (("A", 100), ("B", 200))
    ]
    run = f.run_workload(f.create_core(**cfg), reqs)
    assert run.step(1).num_scheduled_tokens == {"A": 40, "B": 24}


def test_max_num_seqs_limits_admission(factories: Any) -> None:
    f = factories
    core = f.create_core(max_num_seqs=2)
    run = f.run_workload(core, f.create_requests(3, max_tokens=3))
    assert run.step(1).scheduled_new_req_ids == ("r0", "r1") and run.step(1).waiting == ("r2",)
    assert run.step(3).finished == {"r0": "length", "r1": "length"}
    assert run.step(4).scheduled_new_req_ids == ("r2",)


def test_long_prefill_threshold_only_with_company(factories: Any) -> None:
    f = factories
    alone = f.run_workload(
        f.create_core(long_prefill_token_threshold=8),
        [f.make_request("A", f.prompt(100, 40), 2, ignore_eos=True)],
    )
    assert alone.step(1).num_scheduled_tokens == {"A": 40}
    pair = f.run_workload(
        f.create_core(long_prefill_token_threshold=8), f.create_requests(2, 20, 2)
    )
    assert pair.step(1).num_scheduled_tokens == {"r0": 8, "r1": 8}
    assert pair.step(2).num_scheduled_tokens == {"r0": 8, "r1": 8}
    assert pair.step(3).num_scheduled_tokens == {"r0": 4, "r1": 4}


def test_running_cap_leaves_room_for_the_sampled_token(factories: Any) -> None:
    """A prompt of exactly max_model_len never finishes its last chunk (cap M - computed - 1).

    Upstream's input processor refuses such prompts before they reach the scheduler; this pins
    the scheduler rule itself.
    """
    f = factories
    core = f.create_core(max_model_len=64, max_num_batched_tokens=32, max_num_seqs=4)
    run = f.run_workload(core, [f.make_request("A", f.prompt(100, 64), 4)], max_steps=10)
    assert [t.num_scheduled_tokens for t in run.traces[:3]] == [{"A": 32}, {"A": 31}, {}]
    assert all(t.is_idle for t in run.traces[2:]) and run.tokens["A"] == []


def test_scheduler_output_for_new_running_and_resumed(factories: Any) -> None:
    f = factories
    sched = f.create_scheduler(num_blocks=4, max_model_len=48)
    a = f.make_request("A", f.prompt(100, 10), 16, ignore_eos=True)
    b = f.make_request("B", f.prompt(200, 10), 16, ignore_eos=True)
    sched.add_request(a)
    sched.add_request(b)
    out = sched.schedule()
    assert [(n.req_id, n.block_ids, n.num_computed_tokens) for n in out.scheduled_new_reqs] == [
        ("A", [1], 0),
        ("B", [2], 0),
    ]
    sched.update_from_output(out, _runner_output(out, {"A": [5], "B": [6]}))
    for _ in range(6):
        out = sched.schedule()
        cached = out.scheduled_cached_reqs
        assert cached.req_ids == ["A", "B"] and cached.new_block_ids == [None, None]
        assert cached.all_token_ids == {}  # both were scheduled in the previous step
        sched.update_from_output(out, _runner_output(out, {"A": [5], "B": [6]}))
    out = sched.schedule()  # step 8: B preempts itself
    assert out.preempted_req_ids == {"B"} and out.scheduled_cached_reqs.new_block_ids == [[3]]
    assert b.status == RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert b.num_output_tokens == 7 and b.num_preemptions == 1
    sched.update_from_output(out, _runner_output(out, {"A": [5]}))
    sched.finish_requests("A", RequestStatus.FINISHED_ABORTED)
    out = sched.schedule()
    cached = out.scheduled_cached_reqs
    assert out.finished_req_ids == {"A"}
    assert cached.req_ids == ["B"] and cached.resumed_req_ids == {"B"}
    assert cached.all_token_ids == {"B": b.all_token_ids}
    assert cached.new_block_ids == [[2, 3]]  # its own cached block 2, then A's freed block 3
    assert cached.num_computed_tokens == [16] and cached.num_output_tokens == [7]
    assert out.num_scheduled_tokens == {"B": 1}


def test_update_trims_tokens_after_a_stop(factories: Any) -> None:
    f = factories
    sched = f.create_scheduler()
    request = f.make_request("A", [1, 2, 3], 10, stop_token_ids=[42])
    sched.add_request(request)
    out = sched.schedule()
    (result,) = sched.update_from_output(out, _runner_output(out, {"A": [7, 42, 8, 9]}))
    assert result.new_token_ids == [7, 42] and result.stop_reason == 42
    assert str(result.finish_reason) == "stop" and request.output_token_ids == [7, 42]
    assert sched.get_request_counts() == (0, 0) and sched.has_requests()
    assert sched.kv_cache_manager.block_pool.get_num_free_blocks() == 9999
    assert sched.schedule().finished_req_ids == {"A"} and not sched.has_requests()


def test_abort_running_and_waiting(factories: Any) -> None:
    f = factories
    core = f.create_core(max_num_seqs=1)
    for request in f.create_requests(2, max_tokens=5):
        core.add_request(request)
    core.step()
    assert core.abort_requests(["r0", "r1", "nope"]) in (["r0", "r1"], ["r1", "r0"])
    assert core.abort_requests(["r0"]) == []
    outputs, trace = traced_step(core)
    assert outputs == [] and trace.finished == {"r0": "abort", "r1": "abort"}
    assert trace.stop_reasons == {"r0": None, "r1": None} and trace.num_free_blocks == 9999
    assert not core.has_unfinished_requests()


def test_duplicate_request_id_is_rejected(factories: Any) -> None:
    sched = factories.create_scheduler()
    sched.add_request(factories.make_request("A", [1, 2], 2))
    with pytest.raises(ValueError, match="duplicate"):
        sched.add_request(factories.make_request("A", [1, 2], 2))


def test_num_cached_tokens_and_prefix_stats_for_a_fresh_hit(factories: Any) -> None:
    f = factories
    core = f.create_core()
    shared = f.prompt(100, 40)
    run = f.run_workload(
        core,
        [f.make_request("A", shared, 2), (3, f.make_request("B", shared + [7, 8], 2))],
    )
    first = {t.step: t for t in run.traces}
    assert first[4].num_scheduled_tokens == {"B": 10}  # 42 tokens, 32 cached
    stats = core.make_stats()
    assert (stats.prefix_cache_stats.queries, stats.prefix_cache_stats.hits) == (82, 32)
    assert stats.kv_cache_usage == 0.0 and stats.num_running_reqs == 0


def test_first_output_carries_num_cached_tokens(factories: Any) -> None:
    f = factories
    core = f.create_core(max_num_batched_tokens=16, max_num_seqs=2)
    shared = f.prompt(100, 40)
    core.add_request(f.make_request("A", shared, 1))
    while core.has_unfinished_requests():
        core.step()
    core.add_request(f.make_request("B", shared + [9] * 8, 3))
    seen = []
    while core.has_unfinished_requests():
        outputs = core.step().outputs
        seen.extend((o.num_cached_tokens, len(o.new_token_ids)) for o in outputs)
    assert seen == [(32, 1), (None, 1), (None, 1)]
