"""The model runner on the scripted model: greedy tokens equal the script in every batch shape."""

from __future__ import annotations

import pytest
import torch

from contract.scripted import script
from contract.scripted.vocab import (
    ASSISTANT,
    BOS,
    EOS,
    LOOP,
    TICK,
    UTF8,
    answer_selector,
    number,
    think_selector,
)
from engine.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from engine.worker.input_batch import SchedulerContractError

pytestmark = pytest.mark.timeout(120)

FILLER = [number(n % 100) for n in range(7, 40_000, 13)]  # " n" words: no selectors


def chat(think: int | None, answer: int) -> list[int]:
    selectors = ([think_selector(think)] if think is not None else []) + [answer_selector(answer)]
    return [BOS, *selectors, EOS, ASSISTANT]


PROMPTS = {
    "countdown": [BOS, number(12)],
    "letters": [BOS, 360],
    "reasoning": chat(3, 2),
    "no-think": chat(None, 5),
    "loop": [BOS, LOOP, EOS, ASSISTANT],
    "utf8": [BOS, UTF8],
    "think-raw": [BOS, answer_selector(4), think_selector(5)],
    "one-token": [BOS],
}


def run_and_check(driver, greedy, prompts: dict[str, list[int]], max_tokens: int = 24) -> None:
    for req_id, prompt in prompts.items():
        driver.add(req_id, prompt, greedy(max_tokens))
    outputs = driver.run()
    for req_id, prompt in prompts.items():
        assert outputs[req_id] == script.expected(prompt, max_tokens), req_id


@pytest.mark.parametrize("name", sorted(PROMPTS))
def test_single_request_matches_script(driver, greedy, name: str) -> None:
    run_and_check(driver(), greedy, {name: PROMPTS[name]})


def test_concurrent_requests_of_different_lengths(driver, greedy) -> None:
    prompts = dict(PROMPTS)
    for n in (5, 40, 77, 130):
        prompts[f"filler{n}"] = [BOS, answer_selector(n % 7), *FILLER[:n], ASSISTANT]
    for n in (1, 17, 33):
        prompts[f"tick{n}"] = [BOS] + [TICK] * n
    d = driver()
    run_and_check(d, greedy, prompts, max_tokens=40)
    assert len(d.outputs[0].req_ids) == len(prompts)  # one step admitted them all


@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("prompt_len", [31, 32, 33, 63, 64, 65])
def test_block_boundaries(driver, greedy, block_size: int, prompt_len: int) -> None:
    answer = [BOS, answer_selector(3), *FILLER[: prompt_len - 3], ASSISTANT]
    ticking = [BOS] + [TICK] * (prompt_len - 1)  # crosses the next boundary while decoding
    assert len(answer) == len(ticking) == prompt_len
    run_and_check(driver(block_size=block_size), greedy, {"answer": answer, "tick": ticking}, 40)


def test_chunked_prefill_across_steps(driver, greedy) -> None:
    prompt = [BOS, answer_selector(6), *FILLER[:50], ASSISTANT]
    d = driver(token_budget=7)
    d.add("long", prompt, greedy(10))
    assert d.step().sampled_token_ids == [[]]  # a partial prefill chunk samples nothing
    assert d.run()["long"] == script.expected(prompt, 10)
    assert d.requests["long"].partial_steps == -(-len(prompt) // 7) - 1


def test_chunked_prefill_mixed_with_decodes(driver, greedy) -> None:
    short = [BOS, number(30)]
    long = [BOS, answer_selector(9), *FILLER[:90], ASSISTANT]
    d = driver(token_budget=20, block_size=32)
    d.add("short", short, greedy(25))
    d.step()
    d.add("long", long, greedy(12))
    mixed = d.step()  # one decode and a 19-token chunk in the same forward
    assert mixed.req_ids == ["short", "long"]
    assert len(mixed.sampled_token_ids[0]) == 1 and mixed.sampled_token_ids[1] == []
    outputs = d.run()
    assert outputs["short"] == script.expected(short, 25)
    assert outputs["long"] == script.expected(long, 12)


@pytest.mark.parametrize("steps_away", [0, 3])
def test_preempted_and_resumed(driver, greedy, steps_away: int) -> None:
    """Preempted mid-decode, later resumed in other blocks, rebuilt from all its tokens."""
    prompt = chat(4, 6)
    other = [BOS] + [TICK] * 20
    d = driver()
    d.add("victim", prompt, greedy(20))
    d.add("other", other, greedy(20))
    for _ in range(5):
        d.step()
    old_blocks = d.requests["victim"].blocks[:]
    d.preempt("victim")
    d.free.rotate(7)  # it comes back in different blocks
    for _ in range(steps_away):
        d.step(chunk={"victim": 0})
    d.step()
    assert d.last_scheduled is not None
    assert "victim" in d.last_scheduled.scheduled_cached_reqs.resumed_req_ids
    assert d.requests["victim"].blocks != old_blocks
    outputs = d.run()
    assert outputs["victim"] == script.expected(prompt, 20)
    assert outputs["other"] == script.expected(other, 20)


@pytest.mark.parametrize("budget", [8192, 512])
def test_long_prompt_3000_tokens(driver, greedy, budget: int) -> None:
    prompt = [BOS, answer_selector(5), *FILLER[:2997], ASSISTANT]
    assert len(prompt) == 3000
    run_and_check(
        driver(token_budget=budget, block_size=32, num_blocks=256), greedy, {"r": prompt}, 8
    )


def test_bfloat16_matches_script(driver, greedy) -> None:
    d = driver(token_budget=16, dtype=torch.bfloat16)
    run_and_check(d, greedy, {n: PROMPTS[n] for n in ("reasoning", "countdown", "think-raw")})


def test_min_tokens_and_ignore_eos(driver, greedy) -> None:
    prompt = [BOS, number(2)]
    d = driver()
    d.add("min", prompt, greedy(12, min_tokens=6))
    d.add("ignore", prompt, greedy(7, ignore_eos=True))
    outputs = d.run()
    assert outputs["min"] == script.expected(prompt, 12, min_tokens=6)
    assert outputs["ignore"] == script.expected(prompt, 7, ignore_eos=True)


def test_null_block_never_written_and_state_dropped(driver, greedy) -> None:
    d = driver(token_budget=9, num_blocks=64)
    run_and_check(d, greedy, {"a": PROMPTS["reasoning"], "b": [BOS] + [TICK] * 40})
    for key_cache, value_cache in d.runner.kv_caches:
        assert not key_cache[0].any() and not value_cache[0].any()
    assert d.runner.requests == {}


def test_contract_errors(runner_factory, greedy) -> None:
    runner = runner_factory()
    unknown = CachedRequestData(["ghost"], set(), [], {}, [None], [3], [0])
    with pytest.raises(SchedulerContractError, match="ghost"):
        runner.execute_model(SchedulerOutput([], unknown, {"ghost": 1}, 1, set()))
    null = NewRequestData("n", [BOS, TICK], greedy(4), [0], 0)
    with pytest.raises(SchedulerContractError, match="null block"):
        runner.execute_model(SchedulerOutput([null], CachedRequestData(), {"n": 2}, 2, set()))
    short = NewRequestData("s", [BOS] + [TICK] * 20, greedy(4), [5], 0)
    with pytest.raises(SchedulerContractError, match="needs 2 blocks"):
        runner.execute_model(SchedulerOutput([short], CachedRequestData(), {"s": 21}, 21, set()))
    assert EOS not in runner.requests
