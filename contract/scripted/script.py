"""The script of the scripted test model, in pure Python (docs/scripted-model.md, "The script").

Upstream: none for the script itself. ``expected`` follows vLLM's stop rules at the pin:
``vllm/v1/core/sched/utils.py:98-127`` (``check_stop``: EOS unless ignore_eos, then
stop_token_ids, then max_tokens; both stop tokens are kept in the output) and
``vllm/v1/sample/logits_processor/builtin.py:195-206`` (``MinTokensLogitsProcessor`` masks
``all_stop_token_ids``, which ``vllm/sampling_params.py:778-784`` fills with EOS even under
ignore_eos). ``max_model_len`` is not modelled.

The weights written by ``contract/scripted/weights.py`` realise these scores
exactly (up to the final RMSNorm's scaling, < 1 %), so greedy decoding of the checkpoint in any
correct engine and any of float32/bfloat16/float16 equals ``expected()``. The scheduler-tier fake
runner samples from ``next_token``/``ranked`` instead of running tensors.

Scores (the logits before the final norm) of the next token after ``context``:

- order-1: the last token ``t`` puts 32 on ``successor(t)`` and 16 on ``" um"``;
- a ladder on the byte tokens ``'A'`` (8) down to ``'T'`` (0.875), step 0.375;
- selector heads (``SELECTOR_HEADS``): a head whose query token is the last token and that finds
  a selector of its family anywhere in the context votes for that selector's targets
  (``<|assistant|>`` -> ``<think>`` +96; ``<think>`` -> the K-th letter from the end +64;
  ``<|assistant|>`` and ``</think>`` -> the answer entry's first token +64), and suppresses the
  order-1 default (-32) so ``" um"`` stays the runner-up. (Exception: after ``<|assistant|>``
  with a think selector, the runner-up of ``<think>`` is the non-thinking answer: the entry's
  first token at 64, or the default ``" 4"`` at 32.) Attention also "fires" when every
  token of the context is a selector of the head's family (a softmax over selector keys only);
  the scores model that too.

Every token with a positive score has a distinct score (>= 22 tie-free ranks); the rest tie at
0 or below. ``ranked`` returns exactly the tie-free ranks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from contract.scripted import vocab
from contract.scripted.vocab import (
    ASSISTANT,
    END_THINK,
    EOS,
    LOOP,
    THINK,
    TICK,
    TOCK,
    UM,
    UTF8,
    VOCAB_SIZE,
    Family,
)

ORDER1_SCORE = 32
UM_SCORE = 16
LADDER_TOP = 8.0
LADDER_STEP = 0.375
LADDER_TOKENS: tuple[int, ...] = tuple(range(ord("A"), ord("T") + 1))
THINK_VOTE = 96
TARGET_VOTE = 64
DEFAULT_SUPPRESSION = -32
DEFAULT_ANSWER = vocab.number(4)
# The bytes <|utf8|> spells out one token at a time (tests incremental UTF-8 decoding).
UTF8_BYTES: tuple[int, ...] = tuple("🙂中文".encode())
_UTF8_NEXT = dict(zip(UTF8_BYTES, (*UTF8_BYTES[1:], EOS), strict=True))
_CONTEXT_DEFAULTS = {ASSISTANT: DEFAULT_ANSWER, THINK: END_THINK, END_THINK: DEFAULT_ANSWER}
_FIXED_SUCCESSORS = {TICK: TOCK, TOCK: TICK, UM: EOS, EOS: EOS, **_CONTEXT_DEFAULTS, **_UTF8_NEXT}


class ScriptError(ValueError):
    """A context or request the script does not define (renders as one line)."""


def ladder_score(token_id: int) -> float:
    """The constant ladder score of a byte token 'A'..'T' (0 for every other token)."""
    if ord("A") <= token_id <= ord("T"):
        return LADDER_TOP - LADDER_STEP * (token_id - ord("A"))
    return 0.0


def successor(token_id: int) -> int:
    """The order-1 next token: what the last token alone predicts."""
    if vocab.NUMBER_BASE <= token_id < vocab.NUMBER_BASE + vocab.NUM_NUMBERS:
        n = token_id - vocab.NUMBER_BASE
        return EOS if n == 0 else vocab.number(n - 1)
    if vocab.LETTER_BASE <= token_id < vocab.LETTER_BASE + vocab.NUM_LETTERS:
        return END_THINK if token_id == vocab.letter("z") else token_id + 1
    if token_id in _FIXED_SUCCESSORS:
        return _FIXED_SUCCESSORS[token_id]
    family = vocab.selector_family(token_id)
    if family is Family.THINK:
        return THINK
    if family is Family.ANSWER:
        return answer_entry(token_id)
    return vocab.number(token_id % 10)


def think_target(selector: int) -> int:
    """What ``<think>`` is followed by under ``<|think:K|>``: the K-th letter from the end."""
    k = selector - vocab.THINK_SELECTOR_BASE
    return END_THINK if k == 0 else vocab.LETTER_BASE + vocab.NUM_LETTERS - k


def answer_entry(selector: int) -> int:
    """The first token of the answer an answer-family selector chooses."""
    if selector == LOOP:
        return TICK
    if selector == UTF8:
        return UTF8_BYTES[0]
    m = selector - vocab.ANSWER_SELECTOR_BASE
    return EOS if m == 0 else vocab.number(m - 1)


Votes = tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class SelectorHead:
    """One attention head that looks a selector up (see weights.py for the weights)."""

    layer: int
    head: int
    family: Family
    query_tokens: frozenset[int]
    votes: Callable[[int], Votes]  # selector id -> ((token id, score), ...)


def _think_votes(selector: int) -> Votes:
    return ((THINK, THINK_VOTE),)


def _letter_votes(selector: int) -> Votes:
    return ((think_target(selector), TARGET_VOTE), (END_THINK, DEFAULT_SUPPRESSION))


def _answer_votes(selector: int) -> Votes:
    return ((answer_entry(selector), TARGET_VOTE), (DEFAULT_ANSWER, DEFAULT_SUPPRESSION))


# Layer 0 heads 5-7 share KV head 1; layer 1 head 2 uses KV head 0 (8 heads, 2 KV heads).
SELECTOR_HEADS: tuple[SelectorHead, ...] = (
    SelectorHead(0, 5, Family.THINK, frozenset({ASSISTANT}), _think_votes),
    SelectorHead(0, 6, Family.THINK, frozenset({THINK}), _letter_votes),
    SelectorHead(0, 7, Family.ANSWER, frozenset({ASSISTANT}), _answer_votes),
    SelectorHead(1, 2, Family.ANSWER, frozenset({END_THINK}), _answer_votes),
)


# ScriptState.key() -> the ranking it implies; shared by every state of the process (bounded).
_RANKINGS: dict[tuple[object, ...], tuple[int, ...]] = {}
_RANKINGS_MAX = 1 << 16


class ScriptState:
    """The script's view of a growing sequence (its last token and its selectors), updated token
    by token: ``push`` each prompt and output token, then ask ``ranked``/``next_token``. Linear
    in the sequence length, unlike calling ``next_token(context)`` at every step; the ranking
    of a state is memoised by ``key()`` (what the scores depend on), so asking is O(1)."""

    def __init__(self) -> None:
        self.last: int | None = None
        self.found: dict[Family, int] = {}
        self.only: dict[Family, bool] = {family: True for family in Family}
        self.num_tokens = 0  # tokens pushed so far

    @classmethod
    def from_tokens(cls, tokens: Iterable[int]) -> ScriptState:
        """A state with every token of ``tokens`` pushed."""
        state = cls()
        state.extend(tokens)
        return state

    def push(self, token_id: int) -> None:
        """Append one token (ScriptError for an out-of-range id or a second distinct selector
        of a family)."""
        if not 0 <= token_id < VOCAB_SIZE:
            raise ScriptError(f"token id {token_id} out of range 0..{VOCAB_SIZE - 1}")
        family = vocab.selector_family(token_id)
        for other in Family:
            self.only[other] = self.only[other] and family is other
        if family is not None:
            seen = self.found.setdefault(family, token_id)
            if seen != token_id:
                raise ScriptError(
                    f"two distinct {family.value} selectors ({seen} and {token_id}) in one sequence"
                )
        self.last = token_id
        self.num_tokens += 1

    def extend(self, tokens: Iterable[int]) -> None:
        """``push`` every token of ``tokens`` in order."""
        for token_id in tokens:
            self.push(token_id)

    def copy(self) -> ScriptState:
        """An independent state with the same tokens pushed."""
        other = ScriptState()
        other.last = self.last
        other.found = dict(self.found)
        other.only = dict(self.only)
        other.num_tokens = self.num_tokens
        return other

    def key(self) -> tuple[object, ...]:
        """Everything the next token's scores depend on (equal keys: equal rankings)."""
        return (self.last, *self.found.items(), *self.only.values())

    def attended(self, head: SelectorHead) -> int | None:
        """The selector the head's attention lands on at the last position (None: nothing)."""
        if self.last in head.query_tokens:
            return self.found.get(head.family)
        # Query -16 avoids selector keys, unless there are only selectors to attend to.
        return self.last if self.only[head.family] else None

    def scores(self) -> dict[int, float]:
        """Non-zero scores of the next token (token id -> score)."""
        if self.last is None:
            raise ScriptError("the script needs a non-empty context")
        result: dict[int, float] = {t: ladder_score(t) for t in LADDER_TOKENS}
        result[successor(self.last)] = ORDER1_SCORE
        result[UM] = result.get(UM, 0.0) + UM_SCORE
        for head in SELECTOR_HEADS:
            selector = self.attended(head)
            if selector is None:
                continue
            for token_id, score in head.votes(selector):
                result[token_id] = result.get(token_id, 0.0) + score
        return {t: s for t, s in result.items() if s != 0}

    def ranking(self) -> tuple[int, ...]:
        """``ranked()`` as a shared, memoised tuple (do not rely on its identity)."""
        key = self.key()
        order = _RANKINGS.get(key)
        if order is None:
            positive = [(s, t) for t, s in self.scores().items() if s > 0]
            positive.sort(key=lambda pair: (-pair[0], pair[1]))
            assert len({s for s, _ in positive}) == len(positive), positive
            if len(_RANKINGS) >= _RANKINGS_MAX:
                _RANKINGS.clear()
            order = _RANKINGS[key] = tuple(t for _, t in positive)
        return order

    def ranked(self) -> list[int]:
        """Token ids best-first: exactly the tie-free ranks."""
        return list(self.ranking())

    def next_token(self) -> int:
        """The greedy next token."""
        return self.ranking()[0]


class ContextState:
    """``ScriptState``'s interface over a script that only answers whole contexts
    (``next_token(context)`` / ``ranked(context)``, e.g. a test double or a cache): it keeps
    the tokens and asks the script with all of them, O(n) per question."""

    def __init__(self, script: ContextScript) -> None:
        self.script = script
        self.tokens: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self.tokens)

    def push(self, token_id: int) -> None:
        self.tokens.append(token_id)

    def extend(self, tokens: Iterable[int]) -> None:
        self.tokens.extend(tokens)

    def ranked(self) -> list[int]:
        return list(self.script.ranked(self.tokens))

    def next_token(self) -> int:
        return self.script.next_token(self.tokens)


class ContextScript(Protocol):
    """What a scheduler-tier fake runner needs of a script: this module is one."""

    def next_token(self, context: Sequence[int]) -> int: ...

    def ranked(self, context: Sequence[int]) -> list[int]: ...


def new_state(script: object = None) -> ScriptState | ContextState:
    """A fresh incremental state for ``script``: its own ``ScriptState`` when it has one (this
    module, the default, does), else a ``ContextState`` over its ``next_token``/``ranked``."""
    if script is None:
        return ScriptState()
    factory = getattr(script, "ScriptState", None)
    if factory is not None:
        return factory()  # type: ignore[no-any-return]
    return ContextState(script)  # type: ignore[arg-type]


def _state(context: Iterable[int]) -> ScriptState:
    return ScriptState.from_tokens(context)


def scores(context: Sequence[int]) -> dict[int, float]:
    """Non-zero scores of the next token after ``context`` (token id -> score)."""
    return _state(context).scores()


def logits(context: Sequence[int]) -> list[float]:
    """All 512 scores after ``context``: the model's logits up to the final norm's scaling."""
    dense = [0.0] * VOCAB_SIZE
    for token_id, score in scores(context).items():
        dense[token_id] = score
    return dense


def ranked(context: Sequence[int]) -> list[int]:
    """Token ids best-first: exactly the tie-free ranks (every positive score; >= 22 of them)."""
    return _state(context).ranked()


def next_token(context: Sequence[int]) -> int:
    """The greedy next token after ``context``."""
    return ranked(context)[0]


def _best_allowed(order: Sequence[int], masked: set[int]) -> int:
    for token_id in order:
        if token_id not in masked:
            return token_id
    raise ScriptError(f"min_tokens masks all {len(order)} tie-free tokens of the script")


def _greedy(prompt_ids: Sequence[int], min_tokens: int, masked: set[int]) -> Iterator[int]:
    """Greedy output tokens after ``prompt_ids``, forever (``masked`` banned while fewer than
    ``min_tokens`` are out)."""
    state = _state(prompt_ids)
    if state.last is None:
        raise ScriptError("the prompt must not be empty")

    def tokens() -> Iterator[int]:
        num_out = 0
        while True:
            order = state.ranked()
            token_id = _best_allowed(order, masked) if num_out < min_tokens else order[0]
            yield token_id
            state.push(token_id)
            num_out += 1

    return tokens()


def _check_counts(num_tokens: int, min_tokens: int) -> None:
    if num_tokens < 0 or min_tokens < 0:
        raise ScriptError(f"max_new_tokens ({num_tokens}) and min_tokens must be >= 0")


def greedy_outputs(
    prompt_ids: Sequence[int],
    num_tokens: int,
    min_tokens: int = 0,
    masked: Iterable[int] = (),
) -> list[int]:
    """The scripted model's greedy token at each of ``num_tokens`` output positions, never
    stopping: while fewer than ``min_tokens`` tokens are out, the ids in ``masked`` are banned
    and the best remaining ranked token is taken (vLLM's ``MinTokensLogitsProcessor``).

    This is what a scheduler-tier fake runner samples as a request's k-th output token whatever
    the scheduler does (chunking, preemption and recompute re-read the same tokens); the
    harness sends it to a worker as ``output_token_ids`` (docs/scheduler-protocol.md)."""
    _check_counts(num_tokens, min_tokens)
    return list(itertools.islice(_greedy(prompt_ids, min_tokens, set(masked)), num_tokens))


def expected(
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    min_tokens: int = 0,
    ignore_eos: bool = False,
    stop_token_ids: Iterable[int] = (),
) -> list[int]:
    """The greedy output tokens of the scripted model, as vLLM's engine would produce them
    (greedy sampling of the model's logits with the same stop rules).

    Stops after EOS (unless ``ignore_eos``; EOS is included), after any of ``stop_token_ids``
    (included) or at ``max_new_tokens``. While fewer than ``min_tokens`` tokens are out, EOS and
    the stop ids are masked (vLLM's MinTokensLogitsProcessor masks ``all_stop_token_ids``,
    which holds EOS even with ``ignore_eos``), so the best remaining ranked token is taken.
    """
    _check_counts(max_new_tokens, min_tokens)
    if min_tokens > max_new_tokens:
        raise ScriptError(f"min_tokens ({min_tokens}) must be <= max_new_tokens ({max_new_tokens})")
    stops = set(stop_token_ids)
    output: list[int] = []
    for token_id in itertools.islice(
        _greedy(prompt_ids, min_tokens, stops | {EOS}), max_new_tokens
    ):
        output.append(token_id)
        if (token_id == EOS and not ignore_eos) or token_id in stops:
            break
    return output
