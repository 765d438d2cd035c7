"""Token ids from a response's text, for a target that does not return them.

vLLM returns generated token ids on request (``return_token_ids``, a vLLM extension); an
OpenAI-compatible server that does not is compared by the ids of its text tokenized with the
scenario model's own tokenizer (``tokenizer.json``, no special tokens added): exact for the
scripted model, whose every output token is one tokenizer token, except what never reaches the
text (``</s>``, ``<think>`` markers a reasoning parser moves). So the differ compares token ids
like for like: the servers' own when both sent them, else ``text_token_ids`` on both sides
(``Parsed.token_ids_derived`` marks ids that are derived in results and reports).
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from parity.serve.observe import ChoiceResult, Parsed, RequestObservation

T = TypeVar("T", Parsed, ChoiceResult)


@functools.lru_cache(maxsize=8)
def _tokenizer(folder: str) -> Any:
    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def tokenize(text: str | None, model_dir: Path) -> tuple[int, ...] | None:
    """The ids of ``text`` (None: no text, or no tokenizer in the model folder)."""
    tokenizer = _tokenizer(str(model_dir))
    if text is None or tokenizer is None:
        return None
    return tuple(tokenizer.encode(text, add_special_tokens=False).ids)


def with_text_ids(observation: RequestObservation, model_dir: Path) -> RequestObservation:
    """``observation`` with ``text_token_ids`` set on every choice, and ``token_ids`` filled
    from them (marked derived) where the server sent none."""
    result = observation.result
    if result.text is None and not result.other_choices:
        return observation
    others = tuple(_choice(c, model_dir) for c in result.other_choices)
    return replace(observation, result=_parsed(result, model_dir, others))


def _parsed(result: Parsed, model_dir: Path, others: tuple[ChoiceResult, ...]) -> Parsed:
    return replace(_with_ids(result, model_dir), other_choices=others)


def _choice(choice: ChoiceResult, model_dir: Path) -> ChoiceResult:
    return _with_ids(choice, model_dir)


def _with_ids(item: T, model_dir: Path) -> T:
    """A result or choice with its text tokenized, and its token ids derived if it had none."""
    ids = tokenize(item.text, model_dir)
    derived = item.token_ids is None and ids is not None
    token_ids = ids if derived else item.token_ids
    return replace(item, text_token_ids=ids, token_ids=token_ids, token_ids_derived=derived)
