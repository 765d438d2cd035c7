"""Hypothesis state machine over the engine core: random configs, arrivals, steps and aborts.

After every rule: the token budget and max_num_seqs hold, requests are conserved (submitted =
finished + running + waiting), no request is both running and waiting, waiting requests hold no
blocks, block ref counts equal the number of running holders and free + held = N - 1, and every
request's tokens are a prefix of the script's greedy output (all of it once finished normally).
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from contract.scripted import script, vocab
from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.core.step_trace import traced_step
from engine.request import Request
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(300)

SHARED_PREFIXES = ([vocab.BOS] + list(range(40, 72)), [vocab.BOS] + list(range(150, 170)))


@st.composite
def engine_configs(draw: st.DrawFn) -> tuple[EngineConfig, int]:
    max_model_len = draw(st.sampled_from([32, 64, 128]))
    max_num_seqs = draw(st.integers(1, 4))
    chunked = draw(st.booleans())
    budget = draw(st.sampled_from([8, 16, 32, 64, 256]))
    budget = max(budget, max_num_seqs, 0 if chunked else max_model_len)
    cfg = EngineConfig(
        block_size=draw(st.sampled_from([8, 16, 32])),
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=draw(st.booleans()),
        scheduling_policy=draw(st.sampled_from(["fcfs", "priority"])),
        long_prefill_token_threshold=draw(st.sampled_from([0, 0, 4, 16])),
        watermark=draw(st.sampled_from([0.0, 0.0, 0.2])),
    )
    return cfg, draw(st.integers(2, 16))


class SchedulerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core: EngineCore
        self.submitted: dict[str, Request] = {}
        self.tokens: dict[str, list[int]] = {}
        self.finished: dict[str, str] = {}  # as reported by step traces
        self.aborted: set[str] = set()  # aborted by the abort rule (reported next step)
        self.expected: dict[str, list[int]] = {}

    @initialize(config=engine_configs())
    def start(self, config: tuple[EngineConfig, int]) -> None:
        cfg, num_blocks = config
        self.cfg = cfg
        self.num_blocks = num_blocks
        runner = ScriptedModelRunner(script, block_size=cfg.block_size)
        self.core = EngineCore(cfg, runner, num_blocks)
        self.budget = cfg.scheduler_limits(self.core.max_model_len).max_num_batched_tokens

    @rule(
        prefix=st.sampled_from([0, 1, None]),
        tail=st.lists(st.integers(0, 380), min_size=1, max_size=40),
        max_tokens=st.integers(1, 30),
        min_tokens=st.integers(0, 6),
        ignore_eos=st.booleans(),
        stop=st.sampled_from([(), (vocab.number(0),)]),
        priority=st.integers(0, 2),
    )
    def add_request(
        self,
        prefix: int | None,
        tail: list[int],
        max_tokens: int,
        min_tokens: int,
        ignore_eos: bool,
        stop: tuple[int, ...],
        priority: int,
    ) -> None:
        prompt = (SHARED_PREFIXES[prefix] if prefix is not None else [vocab.BOS]) + tail
        max_model_len = self.core.max_model_len
        prompt = prompt[: max_model_len - 1]
        min_tokens = min(min_tokens, max_tokens)
        params = SamplingParams(
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=ignore_eos,
            stop_token_ids=list(stop),
            temperature=0.0,
        )
        params.update_from_generation_config({"eos_token_id": vocab.EOS}, vocab.EOS)
        rid = f"r{len(self.submitted)}"
        request = Request(
            rid, prompt, params, arrival_time=float(len(self.submitted)), priority=priority
        )
        self.core.add_request(request)
        self.submitted[rid] = request
        self.tokens[rid] = []
        cap = min(max_tokens, max_model_len - len(prompt))
        self.expected[rid] = script.expected(
            prompt, cap, min(min_tokens, cap), ignore_eos=ignore_eos, stop_token_ids=stop
        )

    @rule()
    def step(self) -> None:
        outputs, trace = traced_step(self.core)
        assert sum(trace.num_scheduled_tokens.values()) <= self.budget
        assert len(trace.running) <= self.cfg.max_num_seqs
        for out in outputs:
            self.tokens[out.request_id].extend(out.new_token_ids)
        for rid, reason in trace.finished.items():
            assert rid not in self.finished, f"{rid} finished twice"
            self.finished[rid] = reason
            if reason == "abort":
                assert rid in self.aborted
            else:
                assert rid not in self.aborted
                assert self.tokens[rid] == self.expected[rid]

    def _live(self) -> set[str]:
        return set(self.submitted) - set(self.finished) - self.aborted

    @precondition(lambda self: bool(self._live()))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self._live())))
        assert self.core.abort_requests([rid]) == [rid]
        self.aborted.add(rid)

    @invariant()
    def conservation_and_blocks(self) -> None:
        if not hasattr(self, "cfg"):
            return
        sched = self.core.scheduler
        running = [r.request_id for r in sched.running]
        waiting = [r.request_id for r in sched.waiting]
        assert not set(running) & set(waiting)
        assert len(set(running)) == len(running) and len(set(waiting)) == len(waiting)
        done = set(self.finished) | self.aborted
        assert len(self.submitted) == len(done) + len(running) + len(waiting)
        assert set(running) | set(waiting) == self._live()
        kv = sched.kv_cache_manager
        holders: dict[int, int] = {}
        for rid in running:
            request = self.submitted[rid]
            blocks = kv.get_blocks(rid)
            assert request.num_computed_tokens <= len(blocks) * self.cfg.block_size
            assert request.num_computed_tokens <= request.num_tokens
            for block in blocks:
                holders[block.block_id] = holders.get(block.block_id, 0) + 1
        for rid in waiting:
            assert not kv.get_blocks(rid) and self.submitted[rid].num_computed_tokens == 0
        pool = kv.block_pool
        free_ids = pool.free_block_ids()
        assert len(free_ids) == pool.get_num_free_blocks()
        assert not set(free_ids) & set(holders)
        assert len(free_ids) + len(holders) == self.num_blocks - 1
        for block in pool.blocks[1:]:
            assert block.ref_cnt == holders.get(block.block_id, 0)
        for rid, tokens in self.tokens.items():
            assert tokens == self.expected[rid][: len(tokens)]


def test_scheduler_state_machine() -> None:
    run_state_machine_as_test(
        SchedulerMachine,
        settings=settings(max_examples=150, stateful_step_count=60, deadline=None),
    )
