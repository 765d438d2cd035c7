"""AsyncLLM in-process, over the real EngineCore with the scripted fake runner (no torch)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from contract.scripted import vocab
from contract.scripted.script import expected
from engine.async_llm import AsyncLLM, EngineDeadError, InputLimits, RequestOutput
from engine.config import EngineConfig
from engine.core.engine_core import EngineCore
from engine.core.fake_runner import ScriptedModelRunner
from engine.entrypoints.metrics import PrometheusStatLogger
from engine.entrypoints.openai.api_server import AppState, build_app
from engine.entrypoints.openai.serving_chat import OpenAIServingChat
from engine.entrypoints.openai.serving_completion import OpenAIServingCompletion
from engine.entrypoints.openai.serving_engine import ServingConfig
from engine.entrypoints.openai.serving_tokenization import OpenAIServingTokenization
from engine.entrypoints.startup import load_tokenizer
from engine.sampling_params import SamplingParams

pytestmark = pytest.mark.timeout(60)

MAX_MODEL_LEN = 256
NUM_BLOCKS = 64
LOOP = [vocab.BOS, vocab.LOOP]


@pytest.fixture(scope="module")
def tokenizer(scripted_model_dir: Path) -> Any:
    return load_tokenizer(scripted_model_dir)


class SlowRunner(ScriptedModelRunner):
    """The scripted runner at ~2 ms a step, so shutdown can overlap generation."""

    def execute_model(self, scheduler_output: Any) -> Any:
        time.sleep(0.002)
        return super().execute_model(scheduler_output)


def make_engine(tokenizer: Any, num_blocks: int = NUM_BLOCKS) -> AsyncLLM:
    config = EngineConfig(block_size=16, max_model_len=MAX_MODEL_LEN)
    core = EngineCore(config, SlowRunner(block_size=16), num_blocks)
    limits = InputLimits(MAX_MODEL_LEN, vocab.VOCAB_SIZE, vocab.VOCAB_SIZE - 1, {}, vocab.EOS)
    return AsyncLLM(core, tokenizer, limits)


@pytest.fixture
def engine(tokenizer: Any) -> Iterator[AsyncLLM]:
    llm = make_engine(tokenizer)
    yield llm
    llm.shutdown(0)


def params(max_tokens: int, **kw: Any) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, **kw)


async def collect(llm: AsyncLLM, prompt: list[int], p: SamplingParams, rid: str, stream: bool):
    return [out async for out in llm.generate(prompt, p, rid, stream=stream)]


def test_final_only_output_matches_script(engine: AsyncLLM) -> None:
    prompt = [vocab.BOS, vocab.answer_selector(5)]
    outs = asyncio.run(collect(engine, prompt, params(20), "r1", stream=False))
    assert len(outs) == 1 and outs[0].finished
    choice = outs[0].outputs[0]
    assert choice.token_ids == expected(prompt, 20)
    assert choice.text == " 4 3 2 1 0"
    assert choice.finish_reason == "stop"


def test_stream_yields_deltas(engine: AsyncLLM) -> None:
    outs = asyncio.run(collect(engine, LOOP, params(12), "r2", stream=True))
    tokens = [t for out in outs for t in out.outputs[0].token_ids]
    assert tokens == expected(LOOP, 12)
    assert "".join(out.outputs[0].text for out in outs) == " tick tock" * 6
    assert [out.finished for out in outs][-1] is True
    assert outs[-1].outputs[0].finish_reason == "length"


def test_parallel_sampling_fans_out(engine: AsyncLLM) -> None:
    p = SamplingParams(max_tokens=4, temperature=1.0, n=3, seed=5)
    outs = asyncio.run(collect(engine, LOOP, p, "r3", stream=False))
    assert len(outs) == 1
    assert [c.index for c in outs[0].outputs] == [0, 1, 2]
    assert all(c.token_ids == expected(LOOP, 4) for c in outs[0].outputs)


def test_cancelled_generate_aborts_and_frees_blocks(engine: AsyncLLM) -> None:
    async def run() -> None:
        gen = engine.generate(LOOP, params(MAX_MODEL_LEN - 2), "r4", stream=True)
        await gen.__anext__()
        await gen.aclose()  # what a client disconnect does to the response generator
        for _ in range(200):
            if (
                not engine.num_unfinished_requests()
                and not engine.engine_core.has_unfinished_requests()
            ):
                break
            await asyncio.sleep(0.01)

    asyncio.run(run())
    assert not engine.engine_core.has_unfinished_requests()
    assert engine.engine_core.make_stats().kv_cache_usage == 0.0


def test_shutdown_abort_finishes_in_flight(engine: AsyncLLM) -> None:
    async def run() -> list[RequestOutput]:
        outs: list[RequestOutput] = []
        gen = engine.generate(LOOP, params(MAX_MODEL_LEN - 2), "r5", stream=True)
        outs.append(await gen.__anext__())
        await asyncio.get_running_loop().run_in_executor(None, engine.shutdown, 0)
        outs.extend([o async for o in gen])
        return outs

    outs = asyncio.run(run())
    assert outs[-1].finished
    assert outs[-1].outputs[0].finish_reason == "abort"
    assert not engine.is_running
    with pytest.raises(EngineDeadError):
        asyncio.run(collect(engine, LOOP, params(3), "after", stream=False))


def test_shutdown_drain_completes_and_refuses_new(engine: AsyncLLM) -> None:
    async def run() -> tuple[list[RequestOutput], list[RequestOutput]]:
        loop = asyncio.get_running_loop()
        gen = engine.generate(LOOP, params(200), "r6", stream=True)
        first = [await gen.__anext__()]
        done = loop.run_in_executor(None, engine.shutdown, 30.0)
        await asyncio.sleep(0.05)
        late = await collect(engine, LOOP, params(5), "late", stream=False)
        rest = [o async for o in gen]
        await done
        return first + rest, late

    outs, late = asyncio.run(run())
    tokens = [t for o in outs for t in o.outputs[0].token_ids]
    assert tokens == expected(LOOP, 200)
    assert outs[-1].outputs[0].finish_reason == "length"
    assert late[-1].outputs[0].finish_reason == "abort"
    assert late[-1].outputs[0].token_ids == []


def test_input_validation_raises_on_first_iteration(engine: AsyncLLM) -> None:
    from engine.sampling_params import SamplingParamsError

    with pytest.raises(SamplingParamsError, match="cannot be empty"):
        asyncio.run(collect(engine, [], params(3), "bad", stream=False))
    with pytest.raises(SamplingParamsError, match="Token id 600 is out of vocabulary"):
        asyncio.run(collect(engine, [vocab.BOS, 600], params(3), "bad2", stream=False))


class ExplodingCore(EngineCore):
    def step(self):  # type: ignore[override]
        raise RuntimeError("boom")


def test_dead_engine_fails_requests_and_health(tokenizer: Any) -> None:
    config = EngineConfig(block_size=16, max_model_len=MAX_MODEL_LEN)
    core = ExplodingCore(config, ScriptedModelRunner(block_size=16), NUM_BLOCKS)
    limits = InputLimits(MAX_MODEL_LEN, vocab.VOCAB_SIZE, vocab.VOCAB_SIZE - 1, {}, vocab.EOS)
    llm = AsyncLLM(core, tokenizer, limits)
    serving = ServingConfig(["scripted"], "scripted", MAX_MODEL_LEN)
    state = AppState(
        engine=llm,
        config=serving,
        completion=OpenAIServingCompletion(llm, tokenizer, serving),
        chat=OpenAIServingChat(llm, tokenizer, serving),
        tokenization=OpenAIServingTokenization(llm, tokenizer, serving),
        metrics=PrometheusStatLogger("scripted", MAX_MODEL_LEN),
    )
    app = build_app(state)

    async def run() -> tuple[int, int, dict, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            before = (await client.get("/health")).status_code
            failed = await client.post("/v1/completions", json={"prompt": LOOP, "max_tokens": 3})
            after = (await client.get("/health")).status_code
            return before, failed.status_code, failed.json(), after

    try:
        before, status, body, after = asyncio.run(run())
    finally:
        llm.shutdown(0)
    assert before == 200
    assert status == 500
    assert body["error"]["type"] == "InternalServerError"
    assert body["error"]["message"].startswith("EngineCore encountered an issue.")
    assert after == 503
    assert llm.errored
    with pytest.raises(EngineDeadError):
        asyncio.run(collect(llm, LOOP, params(3), "x", stream=False))
