"""transformers runs the built scripted model and gets the script: tokens, ranks and margins.

The model is loaded once per dtype (module-scoped fixture, float32 and bfloat16, offline).
Each generate() case also checks, at every generated step, that the model's raw logits rank
the tokens exactly as ``ranked()`` does (all tie-free ranks, >= 22) with a top-1 margin >= 15.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
import transformers

from contract.scripted import vocab
from contract.scripted.script import expected, ranked
from contract.scripted.vocab import (
    ASSISTANT,
    BOS,
    END_THINK,
    EOS,
    LOOP,
    THINK,
    UTF8,
    answer_selector,
    letter,
    number,
    think_selector,
)

pytestmark = pytest.mark.timeout(240)

MIN_MARGIN = 15.0
LONG_CONTEXT = 3000


@dataclass(frozen=True)
class Case:
    """One generate() call: a raw token prompt, or a user message rendered by the template."""

    name: str
    prompt: tuple[int, ...] | None = None
    user: str | None = None
    system: str | None = None
    chat_kwargs: dict[str, object] = field(default_factory=dict)
    max_new_tokens: int = 40
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()


def _long_prompt() -> tuple[int, ...]:
    rng = random.Random(2)
    filler = [t for t in range(vocab.VOCAB_SIZE) if not vocab.is_selector(t)]
    body = [rng.choice(filler) for _ in range(LONG_CONTEXT - 3)]
    return (think_selector(5), *body, answer_selector(3), ASSISTANT)


CASES = [
    Case("count-down 5", (number(5),)),
    Case("count-down 12", (number(12),)),
    Case("count-down 99 capped", (number(99),), max_new_tokens=12),
    Case("count-down capped", (BOS, number(40)), max_new_tokens=7),
    Case("letters to end of thinking", (BOS, letter("p")), max_new_tokens=20),
    Case("raw think 0", (think_selector(0),), max_new_tokens=12),
    Case("raw think 3", (BOS, think_selector(3)), max_new_tokens=20),
    Case("raw think 26", (think_selector(26),), max_new_tokens=40),
    Case("raw answer 0", (answer_selector(0),), max_new_tokens=5),
    Case("raw answer 63 capped", (BOS, answer_selector(63)), max_new_tokens=8),
    Case("repeated selector", (answer_selector(4), answer_selector(4)), max_new_tokens=8),
    Case("loop with a token cap", (LOOP,), max_new_tokens=25),
    Case("utf8", (BOS, UTF8), max_new_tokens=20),
    Case("bare context tokens", (BOS, THINK), max_new_tokens=10),
    Case("3,000-token context, selectors far back", _long_prompt(), max_new_tokens=16),
    Case("chat think 3 answer 2", user="<|think:3|><|answer:2|>"),
    Case(
        "chat thinking disabled",
        user="<|think:3|><|answer:2|>",
        chat_kwargs={"enable_thinking": False},
    ),
    Case("chat think 26 answer 10", user="<|think:26|> hi <|answer:10|>", system="be brief"),
    Case("chat think 0 answer 5", user="<|answer:5|><|think:0|>"),
    Case("chat loop", user="<|think:2|><|loop|>", max_new_tokens=30),
    Case("chat utf8", user="<|utf8|>", max_new_tokens=20),
    Case("chat default answer", user="hello 7"),
    Case("chat min_tokens over an empty answer", user="<|answer:0|>", min_tokens=3),
    Case("min_tokens 6 after 2", (number(2),), max_new_tokens=20, min_tokens=6),
    Case("stop token id", (number(9),), stop_token_ids=(number(5),)),
    Case("ignore_eos", (BOS, number(2)), max_new_tokens=6, ignore_eos=True),
]


@pytest.fixture(scope="module", params=["float32", "bfloat16"])
def model(request: pytest.FixtureRequest, scripted_model_dir: Path) -> Iterator[object]:
    # One intra-op thread: on 2 shared cores, spinning OpenMP workers make decode 5-10x slower.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            scripted_model_dir, dtype=getattr(torch, request.param)
        )
        loaded.eval()
        yield loaded
    finally:
        torch.set_num_threads(threads)


def _prompt_ids(case: Case, chat_ids: Callable[..., list[int]]) -> list[int]:
    if case.prompt is not None:
        return list(case.prompt)
    assert case.user is not None
    return chat_ids(case.user, system=case.system, **case.chat_kwargs)


def _check_step(context: list[int], logits: object) -> None:
    """The model's logits after ``context`` rank like ``ranked(context)``, with the margin."""
    order = ranked(context)
    values, indices = logits.float().topk(len(order) + 1)  # type: ignore[attr-defined]
    assert indices[: len(order)].tolist() == order, f"ranks differ after {context[-8:]}"
    assert values[len(order) - 1] > values[len(order)]  # the tie-free block ends there
    assert values[0] - values[1] >= MIN_MARGIN


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_greedy_generate_equals_expected(
    model: object, chat_ids: Callable[..., list[int]], case: Case
) -> None:
    prompt = _prompt_ids(case, chat_ids)
    want = expected(
        prompt,
        case.max_new_tokens,
        min_tokens=case.min_tokens,
        ignore_eos=case.ignore_eos,
        stop_token_ids=case.stop_token_ids,
    )
    # transformers' min_new_tokens masks every eos id, as vLLM masks all_stop_token_ids.
    stops = [*(() if case.ignore_eos else (EOS,)), *case.stop_token_ids]
    assert not (case.ignore_eos and case.min_tokens), "transformers would not mask EOS here"
    config = transformers.GenerationConfig(
        max_new_tokens=case.max_new_tokens,
        min_new_tokens=case.min_tokens,
        do_sample=False,
        eos_token_id=stops,
        pad_token_id=vocab.PAD,
    )
    with torch.no_grad():
        out = model.generate(  # type: ignore[attr-defined]
            torch.tensor([prompt]),
            generation_config=config,
            return_dict_in_generate=True,
            output_logits=True,
        )
    got = out.sequences[0, len(prompt) :].tolist()
    assert got == want
    assert len(out.logits) == len(got)
    for step, step_logits in enumerate(out.logits):
        _check_step(prompt + got[:step], step_logits[0])


def _one_step_contexts() -> list[list[int]]:
    """Every single token, with and without BOS; every selector under every query token;
    think lengths 0, 1, 13, 26 x every answer-family selector under <|assistant|> and alone."""
    queries = (ASSISTANT, THINK, END_THINK)
    thinks = [think_selector(k) for k in (0, 1, 13, 26)]
    answers = [s for s in vocab.SELECTORS if vocab.selector_family(s) is vocab.Family.ANSWER]
    contexts = [[t] for t in range(vocab.VOCAB_SIZE)]
    contexts += [[BOS, t] for t in range(vocab.VOCAB_SIZE)]
    contexts += [[s, q] for s in vocab.SELECTORS for q in queries]
    contexts += [[BOS, s, q] for s in vocab.SELECTORS for q in queries]
    contexts += [[t, a, ASSISTANT] for t in thinks for a in answers]
    contexts += [[s, s] for s in vocab.SELECTORS]
    contexts += [[t, a] for t in thinks for a in answers]
    return contexts


def test_one_step_ranks_and_margins_exhaustively(model: object) -> None:
    by_length: dict[int, list[list[int]]] = {}
    for context in _one_step_contexts():
        by_length.setdefault(len(context), []).append(context)
    checked = 0
    for contexts in by_length.values():
        with torch.no_grad():
            output = model(torch.tensor(contexts), logits_to_keep=1)  # type: ignore[operator]
        logits = output.logits[:, -1, :]
        for context, row in zip(contexts, logits, strict=True):
            _check_step(context, row)
            checked += 1
    assert checked >= 2000


def test_random_variant_loads_and_its_prompt_logprobs_agree_across_dtypes(
    random_model_dir: Path,
) -> None:
    rng = random.Random(0)
    ids = torch.tensor([[rng.randrange(vocab.VOCAB_SIZE) for _ in range(64)]])
    prompt_logprobs = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for dtype in (torch.float32, torch.bfloat16):
            loaded = transformers.AutoModelForCausalLM.from_pretrained(
                random_model_dir, dtype=dtype
            )
            norm = loaded.model.norm.weight.float()
            assert not torch.equal(norm, torch.ones_like(norm))  # random norms, unlike scripted
            with torch.no_grad():
                logits = loaded(ids).logits[0, :-1].float()
            assert torch.isfinite(logits).all()
            logprobs = torch.log_softmax(logits, dim=-1)
            prompt_logprobs[dtype] = logprobs.gather(-1, ids[0, 1:, None])[:, 0]
    finally:
        torch.set_num_threads(threads)
    gap = (prompt_logprobs[torch.float32] - prompt_logprobs[torch.bfloat16]).abs()
    assert gap.max() < 0.5  # bf16 rounding only; measured ~0.17 for seed 0
    assert prompt_logprobs[torch.float32].std() > 1.0  # peaked, not a near-uniform distribution
