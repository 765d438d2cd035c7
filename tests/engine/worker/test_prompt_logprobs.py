"""The runner on the random-weights model: logprobs against transformers, seeded sampling."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from contract.scripted.vocab import BOS, EOS
from engine.sampling_params import SamplingParams
from engine.worker.model_runner import ModelRunner

pytestmark = pytest.mark.timeout(240)

PROMPT = [BOS, *range(3, 60, 2), 394, 400, *range(300, 330), 450, 7, 7, 7, 99]  # 67 tokens
TOP = 5


@pytest.fixture(scope="module")
def hf_logprobs(random_model_dir: Path) -> torch.Tensor:
    """transformers' float32 log-softmax over the vocabulary at every prompt position."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)
    with torch.inference_mode():
        logits = model(torch.tensor([PROMPT])).logits[0]
    return torch.log_softmax(logits.float(), dim=-1)


@pytest.fixture(scope="module")
def random_runner(random_model_dir: Path) -> ModelRunner:
    return ModelRunner(random_model_dir, num_blocks=64, block_size=16, dtype=torch.float32)


def params(**kwargs: object) -> SamplingParams:
    p = SamplingParams(temperature=0.0, max_tokens=4, **kwargs)  # type: ignore[arg-type]
    p.eos_token_id, p.all_stop_token_ids = EOS, {EOS}
    return p


@pytest.mark.parametrize("budget", [8192, 30, 66])
def test_prompt_logprobs_match_transformers(
    driver_on, random_runner: ModelRunner, hf_logprobs: torch.Tensor, budget: int
) -> None:
    d = driver_on(random_runner, budget)
    d.add("r", PROMPT, params(prompt_logprobs=TOP, logprobs=TOP))
    d.run()
    returned = [o.prompt_logprobs_dict for o in d.outputs if o.prompt_logprobs_dict]
    assert len(returned) == 1 and set(returned[0]) == {"r"}
    lists = returned[0]["r"]
    assert lists is not None and len(lists.logprobs) == len(PROMPT) - 1
    expected = hf_logprobs[:-1]  # position i scores prompt token i + 1
    targets = torch.tensor(PROMPT[1:])
    got_ids = torch.tensor(lists.logprob_token_ids)
    got = torch.tensor(lists.logprobs)
    assert torch.equal(got_ids[:, 0], targets)
    assert torch.allclose(got[:, 0], expected.gather(1, targets[:, None])[:, 0], atol=1e-3)
    assert torch.equal(got_ids[:, 1:], expected.topk(TOP).indices)
    assert torch.allclose(got[:, 1:], expected.topk(TOP).values, atol=1e-3)
    ranks = (expected >= expected.gather(1, targets[:, None])).sum(-1)
    assert lists.sampled_token_ranks == ranks.tolist()


def test_sampled_logprobs_match_transformers(
    driver_on, random_runner: ModelRunner, hf_logprobs: torch.Tensor
) -> None:
    d = driver_on(random_runner, 8192)
    d.add("r", PROMPT, params(logprobs=3))
    d.step()
    first = d.outputs[0]
    assert first.logprobs is not None
    assert first.sampled_token_ids[0] == [int(hf_logprobs[-1].argmax())]
    assert (
        first.logprobs.logprob_token_ids[0]
        == [int(hf_logprobs[-1].argmax())] + hf_logprobs[-1].topk(3).indices.tolist()
    )
    assert first.logprobs.logprobs[0][1:] == pytest.approx(
        hf_logprobs[-1].topk(3).values.tolist(), abs=1e-3
    )
    assert first.logprobs.sampled_token_ranks == [1]
    d.run()


def seeded(seed: int) -> SamplingParams:
    p = SamplingParams(temperature=1.0, seed=seed, max_tokens=12, ignore_eos=True)
    p.all_stop_token_ids = {EOS}
    return p


def test_seeded_sampling_ignores_chunking_and_batch_mates(
    driver_on, random_runner: ModelRunner
) -> None:
    """A seeded request draws once per sampled token: a partial prefill chunk and other rows
    leave its stream alone (upstream would rewind its generator after a discarded chunk)."""
    alone = driver_on(random_runner, 8192)
    alone.add("r", PROMPT, seeded(1234))
    alone.add("other-seed", PROMPT, seeded(4321))
    outputs = alone.run()
    assert outputs["r"] != outputs["other-seed"]  # it really samples
    chunked = driver_on(random_runner, 9)
    chunked.add("mate", PROMPT[:20], SamplingParams(temperature=1.0, max_tokens=12))
    chunked.add("r", PROMPT, seeded(1234))
    assert chunked.run()["r"] == outputs["r"]
    assert chunked.requests["r"].partial_steps > 0
