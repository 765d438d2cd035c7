"""Token ids and strings of the scripted test model (docs/scripted-model.md, "Tokenizer").

Upstream: none; this is the vocabulary of our own test checkpoint, a byte-level BPE in the
GPT-2 style (the layout of ``tokenizer.json`` that ``tokenizers`` and vLLM read).

Id layout (512 ids):

====== =============================================================================
ids    tokens
====== =============================================================================
0-255  the 256 byte tokens (GPT-2 byte-to-unicode map: id = byte value)
256    ``" 0"`` .. 355 ``" 99"`` (merged number words: id = 256 + n)
356    ``" a"`` .. 381 ``" z"`` (merged letter words: id = 356 + letter index)
382    ``" tick"``, 383 ``" tock"``, 384 ``" um"``
385    ``" ti"``, 386 ``" tic"``, 387 ``" to"``, 388 ``" toc"`` (BPE intermediates of tick/tock)
389    ``<s>`` (BOS), 390 ``</s>`` (EOS), 391 ``<pad>``
392    ``<|system|>``, 393 ``<|user|>``, 394 ``<|assistant|>``
395    ``<think>``, 396 ``</think>`` (not special)
397    ``<|think:K|>`` = 397 + K for K = 0..26 (think selectors, not special)
424    ``<|answer:M|>`` = 424 + M for M = 0..63 (answer selectors, not special)
488    ``<|loop|>``, 489 ``<|utf8|>`` (answer-family selectors, not special)
490    ``<|reserved_0|>`` .. 511 ``<|reserved_21|>``
====== =============================================================================
"""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum

VOCAB_SIZE = 512
NUM_BYTES = 256

NUMBER_BASE = 256  # " 0" .. " 99"
NUM_NUMBERS = 100
LETTER_BASE = 356  # " a" .. " z"
NUM_LETTERS = 26
TICK = 382
TOCK = 383
UM = 384
# BPE intermediates: " tick" = " t" + "i" -> " ti" + "c" -> " tic" + "k".
TI = 385
TIC = 386
TO = 387
TOC = 388

BOS = 389
EOS = 390
PAD = 391
SYSTEM = 392
USER = 393
ASSISTANT = 394
THINK = 395
END_THINK = 396
THINK_SELECTOR_BASE = 397
MAX_THINK = 26
ANSWER_SELECTOR_BASE = 424
MAX_ANSWER = 63
LOOP = 488
UTF8 = 489
RESERVED_BASE = 490
NUM_RESERVED = VOCAB_SIZE - RESERVED_BASE


class Family(Enum):
    """A selector family: at most one distinct selector of each per sequence."""

    THINK = "think"
    ANSWER = "answer"


def _bytes_to_unicode() -> dict[int, str]:
    """The GPT-2 byte-to-unicode map: printable bytes map to themselves, the rest to 256+n."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\xa1"), ord("\xac") + 1),
        *range(ord("\xae"), ord("\xff") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(NUM_BYTES):
        if b not in mapping:
            mapping[b] = chr(NUM_BYTES + shifted)
            shifted += 1
    return mapping


BYTE_TO_UNICODE: dict[int, str] = _bytes_to_unicode()
SPACE = BYTE_TO_UNICODE[ord(" ")]  # "Ġ"


def number(n: int) -> int:
    """Id of the word token ``" n"`` (0 <= n <= 99)."""
    if not 0 <= n < NUM_NUMBERS:
        raise ValueError(f"no number token for {n}: the vocabulary has ' 0'..' 99'")
    return NUMBER_BASE + n


def letter(ch: str) -> int:
    """Id of the word token ``" ch"`` for a lower-case letter ``ch``."""
    if len(ch) != 1 or not "a" <= ch <= "z":
        raise ValueError(f"no letter token for {ch!r}: the vocabulary has ' a'..' z'")
    return LETTER_BASE + ord(ch) - ord("a")


def think_selector(k: int) -> int:
    """Id of ``<|think:K|>``: think for K letters (0 <= K <= 26)."""
    if not 0 <= k <= MAX_THINK:
        raise ValueError(f"think length {k} out of range 0..{MAX_THINK}")
    return THINK_SELECTOR_BASE + k


def answer_selector(m: int) -> int:
    """Id of ``<|answer:M|>``: answer with M number words (0 <= M <= 63)."""
    if not 0 <= m <= MAX_ANSWER:
        raise ValueError(f"answer length {m} out of range 0..{MAX_ANSWER}")
    return ANSWER_SELECTOR_BASE + m


def selector_family(token_id: int) -> Family | None:
    """The family of a selector token, or None for any other token."""
    if THINK_SELECTOR_BASE <= token_id <= THINK_SELECTOR_BASE + MAX_THINK:
        return Family.THINK
    if ANSWER_SELECTOR_BASE <= token_id <= UTF8:
        return Family.ANSWER
    return None


def is_selector(token_id: int) -> bool:
    """Whether the token is a think or answer-family selector."""
    return selector_family(token_id) is not None


SELECTORS: tuple[int, ...] = tuple(range(THINK_SELECTOR_BASE, UTF8 + 1))


def _word_strings() -> Iterator[tuple[int, str]]:
    """(id, text) of every merged word token, in id order."""
    for n in range(NUM_NUMBERS):
        yield NUMBER_BASE + n, f" {n}"
    for i in range(NUM_LETTERS):
        yield LETTER_BASE + i, " " + chr(ord("a") + i)
    yield from ((TICK, " tick"), (TOCK, " tock"), (UM, " um"))
    yield from ((TI, " ti"), (TIC, " tic"), (TO, " to"), (TOC, " toc"))


WORDS: dict[str, int] = {text: token_id for token_id, text in _word_strings()}


def word(text: str) -> int:
    """Id of a merged word token by its text, e.g. ``word(" tick") == 382``."""
    try:
        return WORDS[text]
    except KeyError:
        raise ValueError(
            f"{text!r} is not a single word token of the scripted vocabulary"
        ) from None


def _added_strings() -> Iterator[tuple[int, str, bool]]:
    """(id, content, special) of every added token, in id order."""
    yield BOS, "<s>", True
    yield EOS, "</s>", True
    yield PAD, "<pad>", True
    yield SYSTEM, "<|system|>", True
    yield USER, "<|user|>", True
    yield ASSISTANT, "<|assistant|>", True
    yield THINK, "<think>", False
    yield END_THINK, "</think>", False
    for k in range(MAX_THINK + 1):
        yield THINK_SELECTOR_BASE + k, f"<|think:{k}|>", False
    for m in range(MAX_ANSWER + 1):
        yield ANSWER_SELECTOR_BASE + m, f"<|answer:{m}|>", False
    yield LOOP, "<|loop|>", False
    yield UTF8, "<|utf8|>", False
    for i in range(NUM_RESERVED):
        yield RESERVED_BASE + i, f"<|reserved_{i}|>", True


ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = tuple(_added_strings())
ADDED: dict[str, int] = {content: token_id for token_id, content, _ in ADDED_TOKENS}


_TEXT_BY_ID: dict[int, str] = {tid: text for table in (WORDS, ADDED) for text, tid in table.items()}


def text_of(token_id: int) -> str:
    """The text a token stands for (a byte token's text is its Latin-1 character)."""
    if 0 <= token_id < NUM_BYTES:
        return chr(token_id)
    try:
        return _TEXT_BY_ID[token_id]
    except KeyError:
        raise ValueError(f"token id {token_id} out of range 0..{VOCAB_SIZE - 1}") from None


def bpe_vocab() -> dict[str, int]:
    """The BPE model's vocabulary (ids 0-388) in byte-level form (``"Ġtick"`` for ``" tick"``)."""
    vocab = {BYTE_TO_UNICODE[b]: b for b in range(NUM_BYTES)}
    for token_id, text in _word_strings():
        vocab[text.replace(" ", SPACE)] = token_id
    return vocab


def bpe_merges() -> list[tuple[str, str]]:
    """Merges, highest priority first, that make every word token a single token."""
    merges = [(SPACE, str(d)) for d in range(10)]
    merges += [(SPACE, chr(ord("a") + i)) for i in range(NUM_LETTERS)]
    merges += [(f"{SPACE}{n // 10}", str(n % 10)) for n in range(10, NUM_NUMBERS)]
    merges += [(f"{SPACE}t", "i"), (f"{SPACE}ti", "c"), (f"{SPACE}tic", "k")]
    merges += [(f"{SPACE}t", "o"), (f"{SPACE}to", "c"), (f"{SPACE}toc", "k")]
    merges.append((f"{SPACE}u", "m"))
    return merges
