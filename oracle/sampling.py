"""Upstream's request-parameter validation, run in-process: the reference for
``engine/sampling_params.py``.

Each helper calls the pinned code itself and returns plain values (message, parameter, value),
so tests compare our errors with upstream's instead of transcribing them:
``SamplingParams`` construction (``vllm/sampling_params.py:556-744``), ``SamplingParams.verify``
(:901-1180) with a real ``ModelConfig``, ``update_from_generation_config`` (:772-800) and
``get_max_tokens`` (``vllm/entrypoints/serve/utils/api_utils.py:169-205``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from oracle.vllm_env import prepare_vllm_import

prepare_vllm_import()

from vllm.config import ModelConfig  # noqa: E402
from vllm.entrypoints.serve.utils import api_utils  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402

ErrorTriple = tuple[str, str | None, Any]


def _error(exc: Exception) -> ErrorTriple:
    if isinstance(exc, VLLMValidationError):
        return exc.args[0], exc.parameter, exc.value
    return str(exc), None, None


def upstream_sampling_error(**kwargs: Any) -> ErrorTriple | None:
    """``SamplingParams(**kwargs)`` upstream: None, or (message, parameter, value)."""
    try:
        SamplingParams(**kwargs)
    except (VLLMValidationError, ValueError) as exc:
        return _error(exc)
    return None


def upstream_normalised(**kwargs: Any) -> dict[str, Any]:
    """The fields upstream's ``__post_init__`` leaves after normalising ``kwargs``."""
    params = SamplingParams(**kwargs)
    names = ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids")
    values = {name: getattr(params, name) for name in names}
    values["bad_words"] = params.bad_words
    values["logprobs"] = params.logprobs
    values["output_text_buffer_length"] = params.output_text_buffer_length
    values["all_stop_token_ids"] = set(params.all_stop_token_ids)
    return values


@functools.lru_cache(maxsize=8)
def _model_config(model_dir: str, max_logprobs: int) -> ModelConfig:
    return ModelConfig(model=model_dir, skip_tokenizer_init=True, max_logprobs=max_logprobs)


def upstream_verify_error(
    model_dir: str | Path, max_logprobs: int = 20, **kwargs: Any
) -> ErrorTriple | None:
    """``SamplingParams(**kwargs).verify(model_config, ...)`` upstream, for the model folder."""
    params = SamplingParams(**kwargs)
    try:
        params.verify(_model_config(str(model_dir), max_logprobs), None, None, None)
    except (VLLMValidationError, ValueError) as exc:
        return _error(exc)
    return None


def upstream_eos_merge(
    generation_config: Mapping[str, Any], eos_token_id: int | None, **kwargs: Any
) -> tuple[int | None, list[int], set[int]]:
    """After ``update_from_generation_config``: (eos_token_id, stop_token_ids, all_stop ids)."""
    params = SamplingParams(**kwargs)
    params.update_from_generation_config(dict(generation_config), eos_token_id)
    return params.eos_token_id, list(params.stop_token_ids or ()), set(params.all_stop_token_ids)


def upstream_get_max_tokens(
    max_model_len: int,
    input_length: int,
    request_max_tokens: int | None,
    default_max_tokens: int | None = None,
    override_max_tokens: int | None = None,
    truncate_prompt_tokens: int | None = None,
) -> int | str:
    """Upstream's ``get_max_tokens``: the value, or its error text."""
    defaults = {} if default_max_tokens is None else {"max_tokens": default_max_tokens}
    try:
        return api_utils.get_max_tokens(
            max_model_len,
            request_max_tokens,
            input_length,
            defaults,
            override_max_tokens=override_max_tokens,
            truncate_prompt_tokens=truncate_prompt_tokens,
        )
    except ValueError as exc:
        return str(exc)
