"""Sampler unit tests: masks, seeded reproducibility, min_tokens, logprobs and ranks."""

from __future__ import annotations

import math

import pytest
import torch

from engine.sample.ops import apply_min_p, apply_penalties, apply_top_k_top_p, gumbel_argmax
from engine.sample.sampler import Sampler

pytestmark = pytest.mark.timeout(60)

EOS = 2  # conftest.EOS
NEG_INF = -float("inf")


def probs_logits(*probs: float) -> torch.Tensor:
    return torch.tensor([[math.log(p) for p in probs]])


def test_greedy_and_tiny_temperature(row, sample) -> None:
    logits = torch.randn(3, 64)
    out = sample(logits, [row(temperature=0.0), row(temperature=1e-6), row(temperature=0.0)])
    assert out.sampled_token_ids.tolist() == logits.argmax(-1).tolist()
    assert out.logprobs_tensors is None


def test_top_k_keeps_exactly_k() -> None:
    logits = torch.randn(3, 64)
    k = torch.tensor([1, 5, 64])  # 64 = vocab: off
    masked = apply_top_k_top_p(logits.clone(), k, None)
    assert torch.isfinite(masked).sum(-1).tolist() == [1, 5, 64]
    for r in range(2):
        kept = set(torch.isfinite(masked[r]).nonzero().flatten().tolist())
        assert kept == set(logits[r].topk(int(k[r])).indices.tolist())


def test_top_p_keeps_the_nucleus() -> None:
    logits = probs_logits(0.05, 0.5, 0.15, 0.3)
    masked = apply_top_k_top_p(logits.clone(), None, torch.tensor([0.75]))
    assert torch.isfinite(masked[0]).tolist() == [False, True, False, True]
    # top-k first, then top-p over what is left, renormalised: 0.526 alone reaches 0.5
    both = apply_top_k_top_p(logits.clone(), torch.tensor([3]), torch.tensor([0.5]))
    assert torch.isfinite(both[0]).tolist() == [False, True, False, False]
    whole = apply_top_k_top_p(logits.clone(), None, torch.tensor([1.0]))
    assert torch.isfinite(whole).all()


def test_min_p_threshold_is_relative_to_the_top() -> None:
    logits = probs_logits(0.5, 0.3, 0.15, 0.05)
    masked = apply_min_p(logits.clone(), torch.tensor([0.2]))  # keep p >= 0.1
    assert torch.isfinite(masked[0]).tolist() == [True, True, True, False]


def test_sampled_tokens_stay_inside_the_masks(row, sample) -> None:
    logits = torch.randn(1, 64).repeat(200, 1)
    top3 = set(logits[0].topk(3).indices.tolist())
    rows = [row(temperature=1.0, top_k=3, seed=s) for s in range(200)]
    tokens = sample(logits, rows).sampled_token_ids.tolist()
    assert set(tokens) <= top3 and len(set(tokens)) > 1


def test_gumbel_matches_softmax_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, NEG_INF, 1.5, -0.5]])
    draws = 40_000
    tokens = gumbel_argmax(logits.expand(draws, -1), torch.arange(draws) * 7 + 13)
    freq = torch.bincount(tokens, minlength=8).double() / draws
    assert freq[5] == 0
    assert (freq - torch.softmax(logits[0].double(), -1)).abs().max() < 0.01


def test_seeded_rows_reproduce_and_ignore_batch_company(row, sample) -> None:
    logits = torch.randn(4, 64)

    def run(seed_rows: list[int | None]) -> list[list[int]]:
        rows = [row(temperature=1.5, seed=s) for s in seed_rows]
        sampler = Sampler(seed=123)
        return [
            sample(logits[: len(rows)], rows, sampler).sampled_token_ids.tolist() for _ in range(8)
        ]

    a = run([7, 8, None, 9])
    b = run([7, 8, None, 9])
    assert [s[:2] + s[3:] for s in a] == [s[:2] + s[3:] for s in b]
    alone = run([7])
    assert [s[0] for s in alone] == [s[0] for s in a]  # other rows do not shift row 0's draws
    assert [s[0] for s in run([70])] != [s[0] for s in a]


def test_mixed_batch_keeps_greedy_rows_greedy(row, sample) -> None:
    logits = torch.randn(6, 64)
    rows = [row(temperature=0.0 if i % 2 else 2.0, seed=i) for i in range(6)]
    tokens = sample(logits, rows).sampled_token_ids.tolist()
    assert tokens[1::2] == logits[1::2].argmax(-1).tolist()


def test_min_tokens_masks_every_stop_id(row, sample) -> None:
    logits = torch.zeros(4, 64)
    logits[:, EOS] = 10.0
    logits[:, 5] = 9.0
    logits[:, 6] = 8.0
    rows = [
        row(output=[1, 1], min_tokens=3, temperature=0.0),
        row(output=[1, 1], min_tokens=3, temperature=0.0, stop_token_ids=[5]),
        row(output=[1, 1], min_tokens=3, temperature=0.0, ignore_eos=True),
        row(output=[1, 1, 1], min_tokens=3, temperature=0.0),  # reached: nothing masked
    ]
    assert rows[2].params.eos_token_id is None and EOS in rows[2].params.all_stop_token_ids
    assert sample(logits, rows).sampled_token_ids.tolist() == [5, 6, 5, EOS]


def test_logprobs_are_raw_with_ranks(row, sample) -> None:
    logits = torch.randn(3, 64)
    logits[1, EOS] = logits[1].max() + 5  # the best token, masked by min_tokens
    rows = [
        row(temperature=0.5, seed=3, logprobs=4),
        row(output=[1], temperature=0.0, min_tokens=2, logprobs=2),
        row(temperature=0.0, logprobs=0),
    ]
    out = sample(logits, rows)
    lp = out.logprobs_tensors
    assert lp is not None and lp.logprob_token_ids.shape == (3, 5)  # sampled + top max(k)
    raw = torch.log_softmax(logits, -1)
    sampled = out.sampled_token_ids
    assert torch.equal(lp.logprob_token_ids[:, 0], sampled)
    assert torch.allclose(lp.logprobs[:, 0], raw.gather(1, sampled[:, None])[:, 0])
    assert torch.equal(lp.logprob_token_ids[:, 1:], raw.topk(4).indices)
    assert torch.allclose(lp.logprobs[:, 1:], raw.topk(4).values)
    expected_ranks = (raw >= raw.gather(1, sampled[:, None])).sum(-1)
    assert torch.equal(lp.selected_token_ranks, expected_ranks)
    assert lp.selected_token_ranks[1] == 2 and lp.selected_token_ranks[2] == 1


def test_logprob_token_ids_replace_the_top_k_for_every_row(row, sample) -> None:
    logits = torch.randn(3, 64)
    rows = [
        row(temperature=0.0, logprob_token_ids=[7, 9, 7]),
        row(temperature=0.0, logprobs=2),  # a top-k row in the same batch: padding instead
        row(temperature=0.0, logprob_token_ids=[11]),
    ]
    out = sample(logits, rows)
    lp = out.logprobs_tensors
    raw = torch.log_softmax(logits, -1)
    sampled = out.sampled_token_ids
    assert lp is not None and lp.logprob_token_ids.shape == (3, 4)  # sampled + longest list
    assert lp.logprob_token_ids.tolist() == [
        [sampled[0].item(), 7, 9, 7],
        [sampled[1].item(), 0, 0, 0],
        [sampled[2].item(), 11, 0, 0],
    ]
    assert torch.allclose(lp.logprobs[0], raw[0, [sampled[0].item(), 7, 9, 7]])
    assert torch.isinf(lp.logprobs[1, 1:]).all() and torch.isinf(lp.logprobs[2, 2:]).all()
    assert torch.equal(lp.selected_token_ranks, (raw >= raw.gather(1, sampled[:, None])).sum(-1))
    assert rows[0].params.num_logprobs == 3 and rows[1].params.num_logprobs == 2


def test_penalties_follow_openai_definitions(row) -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5]])
    out = apply_penalties(
        logits.clone(),
        prompt_token_ids=[[0]],
        output_token_ids=[[1, 2, 2]],
        presence_penalties=torch.tensor([0.25]),
        frequency_penalties=torch.tensor([0.5]),
        repetition_penalties=torch.tensor([2.0]),
    )
    # repetition: /2 if positive, *2 if negative, for prompt or output tokens; then
    # frequency (count * 0.5) and presence (0.25) for output tokens only
    assert out[0].tolist() == pytest.approx([1.0, -4.0 - 0.5 - 0.25, 0.5 - 1.0 - 0.25, 0.5])


def test_penalties_change_greedy_choice(row, sample) -> None:
    logits = torch.zeros(2, 64)
    logits[:, 9] = 1.0
    logits[:, 10] = 0.9
    rows = [
        row(output=[9], temperature=0.0, presence_penalty=0.5),
        row(output=[9], temperature=0.0),
    ]
    assert sample(logits, rows).sampled_token_ids.tolist() == [10, 9]


def test_logit_bias_and_allowed_token_ids(row, sample) -> None:
    logits = torch.zeros(2, 64)
    logits[:, 3] = 1.0
    biased, allowed = row(temperature=0.0), row(temperature=0.0)
    biased.params.logit_bias = {7: 5.0}  # type: ignore[attr-defined]
    allowed.params.allowed_token_ids = [11, 12]  # type: ignore[attr-defined]
    logits[1, 12] = 0.5
    assert sample(logits, [biased, allowed]).sampled_token_ids.tolist() == [7, 12]


def test_bad_words_ban_the_last_token_after_their_prefix(row, sample) -> None:
    logits = torch.zeros(3, 64)
    logits[:, 20] = 3.0
    logits[:, 21] = 2.0
    rows = [row(output=[5, 6], temperature=0.0) for _ in range(3)]
    rows[0].params.bad_words_token_ids = [[20]]
    rows[1].params.bad_words_token_ids = [[6, 20]]
    rows[2].params.bad_words_token_ids = [[5, 20], [1, 2, 3, 4, 20]]
    assert sample(logits, rows).sampled_token_ids.tolist() == [21, 21, 20]
