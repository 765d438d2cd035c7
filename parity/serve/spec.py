"""What a serve-tier run needs from a scenario: server config, requests, limits, and adapters.

These are plain frozen dataclasses so the serve tier can run without a scenario file (tests,
``parity repro``), and ``from_scenario`` builds them from a loaded ``parity.scenario.Scenario``.
Only keys the scenario sets explicitly (pydantic ``model_fields_set``) become server flags or
request-body fields: an absent key tests the server's own default (``max_tokens`` absent tests
upstream's default of 16 for completions and ``max_model_len - prompt_len`` for chat:
docs/upstream-behaviour.md, "Default and clamped max_tokens").

Upstream: the request bodies are vLLM's OpenAI protocol
(``vllm/entrypoints/openai/completion/protocol.py``, ``chat_completion/protocol.py`` at the pin);
the config keys are vLLM's engine-arg names (``vllm/engine/arg_utils.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from contract.engine_args import SERVE_ARGS
from parity._codec import JsonMixin

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the harness's packages

Endpoint = Literal["completions", "chat"]
ENDPOINT_PATHS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}

DEFAULT_STARTUP_TIMEOUT_S = 600.0  # an oracle starts in ~25 s idle, minutes on a busy CI
DEFAULT_REQUEST_TIMEOUT_S = 60.0
DEFAULT_STALL_S = 2.0

# ConfigSpec keys a server takes as flags (vLLM spells them ``--kebab-case``).
CONFIG_FLAG_KEYS = SERVE_ARGS
# Body fields the harness adds for comparison (when the target accepts them and the scenario
# did not set them itself): the generated token ids.
HARNESS_FIELDS: dict[str, Any] = {"return_token_ids": True}
# Server flags a scenario file may put in ``config.extra_args``: the engine server's flags that
# neither load code nor read files. Anything else (vLLM's ``--tool-parser-plugin FILE``,
# ``--trust-remote-code``, ``--middleware``, ``--worker-cls``, ``--chat-template FILE``, ...)
# would let an untrusted file run code in the oracle's server, so ``from_scenario`` refuses it
# unless the caller passes ``allow_any_flags=True`` (flags given on the command line, in a
# ``--target``, are the user's own and are never checked).
FILE_FLAGS = frozenset(
    "--" + name
    for name in (
        *(k.replace("_", "-") for k in CONFIG_FLAG_KEYS),
        *("no-enable-prefix-caching", "no-enable-chunked-prefill", "async-scheduling"),
        *("no-async-scheduling", "enforce-eager", "served-model-name", "api-key"),
        *("shutdown-timeout", "override-generation-config", "enable-prompt-tokens-details"),
        *("enable-force-include-usage", "response-role", "default-chat-template-kwargs"),
        *("disable-log-stats", "enable-log-requests", "disable-uvicorn-access-log"),
        *("max-request-body-bytes",),
    )
)
# RequestSpec keys that are not body fields (or are handled separately).
_NON_BODY_KEYS = frozenset(
    {"id", "endpoint", "stream", "at_ms", "repeat", "concurrency", "at_step"}
    | {"prompt", "prompt_token_ids", "messages", "max_tokens"}
)


@dataclass(frozen=True, slots=True)
class ServerConfig(JsonMixin):
    """One server's configuration: vLLM engine args (only the ones set) and extra flags."""

    model: str = "scripted"  # a folder, or the name of a built model of the project
    engine_args: dict[str, Any] = field(default_factory=dict)  # vLLM names, e.g. block_size
    served_model_name: str | None = None  # default: the model folder's name
    extra_args: tuple[str, ...] = ()

    @property
    def model_dir(self) -> Path:
        return resolve_model(self.model)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_dir.name


@dataclass(frozen=True, slots=True)
class ServeRequestSpec(JsonMixin):
    """One serve-tier request (``repeat`` copies of it, at most ``concurrency`` at once)."""

    id: str
    endpoint: Endpoint = "completions"
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    stream: bool = False
    max_tokens: int | None = None  # None: the key is absent from the body
    body: dict[str, Any] = field(default_factory=dict)  # sampling fields, stream_options, ...
    # added by the harness only for a target that accepts them (HARNESS_FIELDS)
    harness_body: dict[str, Any] = field(default_factory=dict)
    at_ms: float = 0.0
    repeat: int = 1
    concurrency: int | None = None  # None: every copy at once

    def __post_init__(self) -> None:
        forms = [self.prompt is not None, self.prompt_token_ids is not None]
        if self.endpoint == "chat" and (self.messages is None or any(forms)):
            raise ValueError(f"request {self.id}: the chat endpoint takes messages only")
        if self.endpoint == "completions" and (self.messages is not None or sum(forms) != 1):
            raise ValueError(
                f"request {self.id}: completions take exactly one of prompt, prompt_token_ids"
            )
        if self.repeat < 1 or (self.concurrency is not None and self.concurrency < 1):
            raise ValueError(f"request {self.id}: repeat and concurrency must be >= 1")

    def request_body(
        self, model: str, accepts: Callable[[str], bool] | None = None
    ) -> dict[str, Any]:
        """The JSON body sent to the server: the scenario's fields, plus the harness's own
        (``harness_body``) that ``accepts`` says the target takes (all when None)."""
        body: dict[str, Any] = {"model": model}
        if self.messages is not None:
            body["messages"] = [dict(m) for m in self.messages]
        elif self.prompt_token_ids is not None:
            body["prompt"] = list(self.prompt_token_ids)
        else:
            body["prompt"] = self.prompt
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        if self.stream:
            body["stream"] = True
        body.update(self.body)
        for key, value in self.harness_body.items():
            if accepts is None or accepts(key):
                body[key] = value
        return body

    @property
    def extensions(self) -> tuple[str, ...]:
        """The vLLM request extensions the scenario itself asks for (not the harness's)."""
        from parity.targets.defs import REQUEST_EXTENSIONS

        return tuple(key for key in REQUEST_EXTENSIONS if key in self.body)

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    def copy_ids(self) -> list[str]:
        """Ids of the copies: the id itself, or ``id#k`` when repeated."""
        if self.repeat == 1:
            return [self.id]
        return [f"{self.id}#{k}" for k in range(self.repeat)]


@dataclass(frozen=True, slots=True)
class ServeLimits(JsonMixin):
    """Bounds: startup, each request (from its send), and the stall verdict."""

    startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    stall_s: float = DEFAULT_STALL_S


def resolve_model(model: str, project: Any = None) -> Path:
    """A model folder: an absolute path as is; a bare name (``scripted``) is a built model of
    the project's models folder; any other path is relative to the project's folder."""
    path = Path(model)
    if path.is_absolute():
        return path
    from parity.models import ensure_model
    from parity.project import current_project

    folder = (project or current_project()).model_dir(model)
    return ensure_model(folder) if model == folder.name else folder


def config_from_scenario(
    config: Any, *, model: str | None = None, project: Any = None
) -> ServerConfig:
    """A ``ServerConfig`` from a ``parity.scenario.ConfigSpec`` (explicitly set keys only), its
    model resolved to an absolute folder (``resolve_model``)."""
    fields_set = set(getattr(config, "model_fields_set", ()))
    engine_args = {k: getattr(config, k) for k in CONFIG_FLAG_KEYS if k in fields_set}
    chosen = str(resolve_model(model or getattr(config, "model", None) or "scripted", project))
    served = getattr(config, "served_model_name", None)
    return ServerConfig(
        model=chosen,
        engine_args=engine_args,
        served_model_name=served,
        extra_args=tuple(getattr(config, "extra_args", ()) or ()),
    )


def request_from_scenario(request: Any) -> ServeRequestSpec:
    """A ``ServeRequestSpec`` from a ``parity.scenario.RequestSpec``.

    Body fields are the keys the file sets (other than the prompt forms and scheduling keys);
    the harness's own fields (``HARNESS_FIELDS``: ``return_token_ids``, so token ids can be
    compared) go in ``harness_body`` unless the file sets them, and are sent only to a target
    that accepts them.
    """
    fields_set = set(getattr(request, "model_fields_set", ()))
    body: dict[str, Any] = {}
    for key in sorted(fields_set - _NON_BODY_KEYS):
        value = getattr(request, key)
        body[key] = value.model_dump() if hasattr(value, "model_dump") else value
    harness = {k: v for k, v in HARNESS_FIELDS.items() if k not in body}
    messages = getattr(request, "messages", None)
    endpoint: Endpoint = getattr(request, "endpoint", None) or (
        "chat" if messages else "completions"
    )
    ids = getattr(request, "prompt_token_ids", None)
    if getattr(request, "prompt", None) is not None:
        ids = None  # the loader's scheduler-tier ids of a text prompt: the server tokenizes it
    return ServeRequestSpec(
        id=request.id,
        endpoint=endpoint,
        prompt=getattr(request, "prompt", None),
        prompt_token_ids=tuple(ids) if ids is not None else None,
        messages=tuple(_message(m) for m in messages) if messages else None,
        stream=bool(getattr(request, "stream", False)),
        max_tokens=getattr(request, "max_tokens", None) if "max_tokens" in fields_set else None,
        body=body,
        harness_body=harness,
        at_ms=float(getattr(request, "at_ms", None) or 0.0),
        repeat=int(getattr(request, "repeat", 1) or 1),
        concurrency=getattr(request, "concurrency", None),
    )


def limits_from_scenario(limits: Any) -> ServeLimits:
    """``ServeLimits`` from a ``parity.scenario.LimitsSpec`` (unset keys take the defaults)."""
    default = ServeLimits()
    return ServeLimits(
        startup_timeout_s=getattr(limits, "startup_timeout_s", None) or default.startup_timeout_s,
        request_timeout_s=getattr(limits, "request_timeout_s", None) or default.request_timeout_s,
        stall_s=getattr(limits, "stall_s", None) or default.stall_s,
    )


def refused_flags(args: Sequence[str]) -> list[str]:
    """The words of ``args`` that are flags outside ``FILE_FLAGS`` (``--x=v`` counts as ``--x``;
    a negative number is a value, not a flag)."""
    refused = []
    for word in args:
        if not word.startswith("-") or _is_number(word):
            continue
        if word.split("=", 1)[0] not in FILE_FLAGS:
            refused.append(word)
    return refused


def from_scenario(
    scenario: Any, *, model: str | None = None, allow_any_flags: bool = False, project: Any = None
) -> tuple[ServerConfig, list[ServeRequestSpec], ServeLimits]:
    """The serve-tier view of a loaded scenario.

    ``ScenarioError`` (``file:line``) if ``config.extra_args`` names a flag outside
    ``FILE_FLAGS`` and ``allow_any_flags`` is false: a scenario file never makes a server load
    code or read a file of its choosing."""
    refused = refused_flags(getattr(scenario.config, "extra_args", ()) or ())
    if refused and not allow_any_flags:
        from parity.errors import ScenarioError

        where = ("config", "extra_args")
        line = scenario.line_of(where) if hasattr(scenario, "line_of") else None
        raise ScenarioError.at(
            getattr(scenario, "file", "<memory>"),
            line,
            f"config.extra_args: {refused[0]!r} is not allowed in a scenario file (only server "
            "flags that neither load code nor read files: parity.serve.spec.FILE_FLAGS)",
        )
    return (
        config_from_scenario(scenario.config, model=model, project=project),
        [request_from_scenario(r) for r in scenario.requests],
        limits_from_scenario(scenario.limits),
    )


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def _message(message: Any) -> dict[str, Any]:
    if hasattr(message, "model_dump"):
        return dict(message.model_dump(exclude_unset=True))
    if isinstance(message, Mapping):
        return dict(message)
    raise TypeError(f"not a chat message: {message!r}")
