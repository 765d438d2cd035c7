"""Scenario files: the schema (pydantic v2, extra keys forbidden) and the ``Scenario`` model.

A scenario is one YAML file whose ``id`` is its file stem. The core keys (scheduler tier):
``id, description, tier, config, requests, limits, expect``. ``config`` uses vLLM's engine-arg
names (underscored). The serve-tier keys (``endpoint``, ``stream``, sampling fields,
``at_ms``, ``repeat`` / ``concurrency``, ``model``, ``reasoning_parser``, ``extra_args``, time
limits, tolerances) are accepted and optional here; ``parity.loader`` rejects them in a
scheduler-only scenario. Serve-tier ``expect:`` keys (``startup``, ``startup_numbers``,
``max_model_len``, ``status``, ``error_param``, ``text``, ``reasoning``, ``min_preemptions``,
plus the shared per-request ``outcome`` / ``finish_reason`` / ``stop_reason`` /
``num_output_tokens`` / ``output_token_ids``) are checked by ``parity.serve.expect``.

Loading, semantic checks and ``file:line`` error mapping live in ``parity.loader``; this module
is only the shape. ``parity schema`` prints ``Scenario.model_json_schema()``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PlainValidator,
    PositiveFloat,
    PositiveInt,
    PrivateAttr,
    WithJsonSchema,
)

from parity._yaml import LineMap, Path, line_of

Tier = Literal["scheduler", "serve", "both"]
Outcome = Literal["finished", "wedged", "unfinished", "crashed"]
# serve tier (parity.serve.observe.OUTCOMES is this list)
ServeOutcome = Literal[
    "completed",
    "http_error",
    "zero_byte_hang",
    "mid_stream_stall",
    "disconnected",
    "timeout",
    "startup_refused",
    "startup_timeout",
    "crashed",
]
FinishReason = Literal["stop", "length", "abort", "error", "repetition"]
RequestId = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]+$", max_length=64)]


def _max_model_len(value: Any) -> int | str:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value == -1):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ValueError(f"must be a positive integer, 'auto' or -1, got {value!r}")


MaxModelLen = Annotated[
    int | str,
    PlainValidator(_max_model_len),
    WithJsonSchema(
        {"anyOf": [{"type": "integer", "minimum": 1}, {"enum": ["auto", -1]}]},
        mode="validation",
    ),
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def _serve(description: str, **field: Any) -> Any:
    """A ``Field`` of a serve-tier key: its description says so; unset (None) unless ``field``
    (more ``Field`` arguments) gives a default."""
    if "default_factory" not in field:
        field.setdefault("default", None)
    return Field(description=f"serve tier: {description}", **field)


class ConfigSpec(_Strict):
    """Engine arguments, named as vLLM's (``--block-size`` is ``block_size``)."""

    model: str | None = Field(
        default=None,
        description="model: scripted (default) or random (built on demand), or a model folder",
    )
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = Field(
        default="auto", description="weight and activation dtype (--dtype)"
    )
    block_size: PositiveInt = Field(default=16, description="tokens per KV-cache block")
    num_gpu_blocks_override: NonNegativeInt | None = Field(
        default=None, description="KV blocks, null block included (required at the scheduler tier)"
    )
    max_model_len: MaxModelLen | None = Field(
        default=None, description="int, or auto / -1 (auto-fit); unset: derived from the model"
    )
    max_num_seqs: PositiveInt = Field(
        default=256, description="most requests running at once (admission stops there)"
    )
    max_num_batched_tokens: PositiveInt | None = Field(
        default=None, description="token budget of one step; unset: vLLM's default"
    )
    enable_chunked_prefill: bool = Field(
        default=True, description="split a long prefill over steps to fit the token budget"
    )
    enable_prefix_caching: bool = Field(
        default=True, description="reuse full KV blocks of an identical prompt prefix"
    )
    scheduling_policy: Literal["fcfs", "priority"] = Field(
        default="fcfs", description="fcfs: arrival order; priority: lowest priority value first"
    )
    long_prefill_token_threshold: NonNegativeInt = Field(
        default=0, description="cap of prefill tokens one request gets per step (0: no cap)"
    )
    seed: int = Field(default=0, description="engine seed (--seed)")
    # serve tier
    reasoning_parser: str | None = _serve("--reasoning-parser, e.g. deepseek_r1")
    extra_args: list[str] = _serve(
        "extra server flags, e.g. [--enforce-eager]", default_factory=list
    )


class Message(_Strict):
    """One chat message (serve tier)."""

    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description="who speaks"
    )
    content: str | list[str | dict[str, Any]] | None = Field(
        default=None,
        description="the message text, or OpenAI content parts (e.g. {type: text, text: ...})",
    )
    name: str | None = Field(default=None, description="optional speaker name")
    reasoning_content: str | None = Field(
        default=None, description="an earlier assistant turn's reasoning"
    )


class RequestSpec(_Strict):
    """One request. Exactly one of ``prompt_token_ids``, ``prompt``, ``messages``."""

    id: RequestId = Field(description="request id, unique in the file; expect: names it")
    prompt_token_ids: list[NonNegativeInt] | None = Field(
        default=None, min_length=1, description="the prompt as token ids (BOS included if wanted)"
    )
    prompt: str | None = Field(
        default=None,
        description="the prompt as text, BOS added; at the scheduler tier tokenized by the "
        "harness: selectors such as <|answer:5|>, <|think:3|>, <|loop|> and one-token words "
        "( 5, a, tick) of the scripted model",
    )
    messages: list[Message] | None = _serve("a chat conversation (chat endpoint)", min_length=1)
    max_tokens: NonNegativeInt | None = Field(
        default=None, description="most output tokens (required at the scheduler tier)"
    )
    ignore_eos: bool = Field(default=False, description="keep generating past EOS")
    min_tokens: NonNegativeInt = Field(
        default=0, description="EOS and stop_token_ids are masked until this many outputs"
    )
    stop_token_ids: list[NonNegativeInt] = Field(
        default_factory=list, description="token ids that stop the request (kept in the output)"
    )
    priority: int = Field(
        default=0, description="scheduling_policy priority: lower values are scheduled first"
    )
    at_step: NonNegativeInt = Field(
        default=0, description="scheduler tier: added just before step at_step + 1"
    )
    # serve tier
    endpoint: Literal["completions", "chat"] | None = _serve(
        "/v1/completions or /v1/chat/completions"
    )
    model: str | None = _serve("the body's model (default: the served name)")
    stream: bool = _serve("stream server-sent events", default=False)
    stream_options: dict[str, bool] | None = _serve("e.g. {include_usage: true}")
    at_ms: NonNegativeFloat | None = _serve("send this many ms after the run starts")
    repeat: PositiveInt = _serve("send this many copies (id#k), compared one by one", default=1)
    concurrency: PositiveInt | None = _serve("most copies outstanding at once (default: all)")
    max_completion_tokens: NonNegativeInt | None = _serve("chat's max_tokens spelling")
    n: PositiveInt | None = _serve("choices per request (each compared by index)")
    temperature: NonNegativeFloat | None = _serve("sampling temperature (0: greedy)")
    top_p: PositiveFloat | None = _serve("nucleus mass")
    top_k: int | None = _serve("sample from the k best (-1 or 0: all)")
    min_p: NonNegativeFloat | None = _serve("drop tokens below min_p x the best probability")
    seed: int | None = _serve("per-request sampling seed")
    presence_penalty: float | None = _serve("sampling")
    frequency_penalty: float | None = _serve("sampling")
    repetition_penalty: PositiveFloat | None = _serve("sampling (1: none)")
    stop: str | list[str] | None = _serve("stop strings (cut from the text)")
    include_stop_str_in_output: bool | None = _serve("keep the stop string in the text")
    skip_special_tokens: bool | None = _serve("leave special tokens out of the text")
    logprobs: bool | NonNegativeInt | None = _serve("completions: top-k count; chat: true/false")
    top_logprobs: NonNegativeInt | None = _serve("chat: alternatives per token")
    echo: bool | None = _serve("completions: prepend the prompt to the text")
    return_token_ids: bool | None = _serve("the server returns prompt and output token ids")
    include_reasoning: bool | None = _serve("chat: return the reasoning part")
    chat_template_kwargs: dict[str, Any] | None = _serve(
        "chat template variables, e.g. enable_thinking"
    )
    logit_bias: dict[str, float] | None = _serve("token id (as a string) -> bias added to logits")
    bad_words: list[str] | None = _serve("words the output must not contain (vLLM extension)")
    allowed_token_ids: list[NonNegativeInt] | None = _serve(
        "the only token ids that may be sampled (vLLM extension)"
    )
    truncate_prompt_tokens: int | None = _serve(
        "keep only the prompt's last N tokens (-1: max_model_len; vLLM extension)"
    )
    use_beam_search: bool | None = _serve(
        "beam search with n beams instead of sampling (vLLM extension; not streamed)"
    )
    length_penalty: float | None = _serve(
        "beam search: a beam's score is cum_logprob / length ** length_penalty (vLLM extension)"
    )
    thinking_token_budget: int | None = _serve(
        "thinking tokens before the end-of-reasoning marker is forced (-1: unlimited; needs a "
        "reasoning parser; vLLM extension)"
    )
    repetition_detection: dict[str, int] | None = _serve(
        "stop when the output ends in a repeated N-gram: max_pattern_size, min_pattern_size, "
        "min_count (vLLM extension)"
    )


SCHEDULER_REQUEST_KEYS = frozenset(
    {"id", "prompt_token_ids", "prompt", "max_tokens", "ignore_eos", "min_tokens", "stop_token_ids"}
    | {"priority", "at_step"}
)


class LimitsSpec(_Strict):
    """Bounds that turn a hang into a verdict."""

    max_steps: PositiveInt = Field(
        default=1000, description="scheduler tier: stop after this many steps (unfinished)"
    )
    stall_steps: PositiveInt = Field(
        default=50, description="no progress for this many steps = wedged"
    )
    # serve tier
    startup_timeout_s: PositiveFloat | None = _serve("seconds a server may take to become healthy")
    request_timeout_s: PositiveFloat | None = _serve("seconds a request may take from its send")
    stall_s: PositiveFloat | None = _serve("seconds without progress = a stall")
    latency_tolerance_ms: PositiveFloat | None = _serve(
        "compare time to first token and end within this many ms (unset: timing is not compared)"
    )
    logprob_tolerance: NonNegativeFloat = _serve(
        "absolute tolerance on logprob values", default=1e-3
    )
    preemptions_tolerance: NonNegativeInt = _serve(
        "allowed difference of the vllm:num_preemptions delta "
        "(arrival timing over HTTP may change how many preemptions a load causes)",
        default=0,
    )


_ID_MAP = "request id -> "


class StepExpect(_Strict):
    """Expected fields of one StepTrace (each compared whole; unset fields are not checked)."""

    num_scheduled_tokens: dict[str, int] | None = Field(
        default=None, description=_ID_MAP + "tokens scheduled this step (scheduled requests only)"
    )
    scheduled_new_req_ids: list[str] | None = Field(
        default=None, description="admitted from the waiting queue this step, in order"
    )
    scheduled_resumed_req_ids: list[str] | None = Field(
        default=None, description="admitted back after a preemption this step, in order"
    )
    scheduled_running_req_ids: list[str] | None = Field(
        default=None, description="already running and scheduled this step, in order"
    )
    preempted_req_ids: list[str] | None = Field(
        default=None, description="preempted during this step's schedule, in order"
    )
    finished: dict[str, FinishReason] | None = Field(
        default=None, description=_ID_MAP + "finish reason, of requests finished this step"
    )
    sampled_token_ids: dict[str, list[int]] | None = Field(
        default=None, description=_ID_MAP + "tokens sampled this step"
    )
    block_ids: dict[str, list[int]] | None = Field(
        default=None, description=_ID_MAP + "KV block ids held after the step (running requests)"
    )
    num_computed_tokens: dict[str, int] | None = Field(
        default=None, description=_ID_MAP + "computed tokens after the step (unfinished requests)"
    )
    running: list[str] | None = Field(default=None, description="the running queue, in order")
    waiting: list[str] | None = Field(default=None, description="the waiting queue, in order")
    num_free_blocks: int | None = Field(
        default=None, description="free KV blocks after the step (null block excluded)"
    )


class ExpectSpec(_Strict):
    """What every target must show (checked per target, independently of the diff)."""

    outcome: dict[str, Outcome | ServeOutcome] = Field(
        default_factory=dict,
        description=_ID_MAP + "finished / wedged / unfinished / crashed (scheduler tier) or a "
        "serve-tier outcome (completed, http_error, zero_byte_hang, ...)",
    )
    finish_reason: dict[str, FinishReason] = Field(
        default_factory=dict, description=_ID_MAP + "stop / length / abort / error / repetition"
    )
    stop_reason: dict[str, int | str | None] = Field(
        default_factory=dict,
        description=_ID_MAP + "the stop token id or stop string (null: EOS or length)",
    )
    num_output_tokens: dict[str, NonNegativeInt] = Field(
        default_factory=dict, description=_ID_MAP + "number of output tokens"
    )
    output_token_ids: dict[str, list[int]] = Field(
        default_factory=dict, description=_ID_MAP + "the output token ids"
    )
    num_preemptions: dict[str, NonNegativeInt] = Field(
        default_factory=dict, description="scheduler tier: " + _ID_MAP + "times preempted"
    )
    finished_at_step: dict[str, PositiveInt] = Field(
        default_factory=dict, description="scheduler tier: " + _ID_MAP + "the step it finished in"
    )
    wedged_at_step: PositiveInt | None = Field(
        default=None, description="scheduler tier: first step without progress"
    )
    steps: dict[PositiveInt, StepExpect] = Field(
        default_factory=dict,
        description="scheduler tier: step number (1-based) -> expected StepTrace fields",
    )
    # serve tier (parity.serve.expect): per target, independently of the diff
    startup: Literal["started", "refused"] | None = _serve(
        "the startup outcome every target must show"
    )
    startup_numbers: dict[str, int] = _serve(
        "numbers of the startup log, e.g. estimated_max_model_len", default_factory=dict
    )
    max_model_len: PositiveInt | None = _serve("/v1/models max_model_len")
    status: dict[str, int] = _serve("HTTP status", default_factory=dict)
    error_param: dict[str, str | None] = _serve(
        "error.param of the error body", default_factory=dict
    )
    text: dict[str, str | None] = _serve("completion text or chat content", default_factory=dict)
    reasoning: dict[str, str | None] = _serve("chat reasoning (null: none)", default_factory=dict)
    num_choices: dict[str, NonNegativeInt] = _serve("choices returned (n)", default_factory=dict)
    min_preemptions: NonNegativeInt | None = _serve(
        "at least this many preemptions (metrics delta)"
    )


class Scenario(_Strict):
    """One scenario file. ``id`` equals the file stem."""

    id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        max_length=100,
        description="the scenario id: the file name without .yaml",
    )
    description: str = Field(min_length=1, description="what the scenario shows and why")
    tier: Tier = Field(
        description="scheduler: in process, step by step; serve: over HTTP; both: each"
    )
    config: ConfigSpec = Field(default_factory=ConfigSpec, description="engine arguments")
    requests: list[RequestSpec] = Field(min_length=1, description="the requests, in order")
    limits: LimitsSpec = Field(
        default_factory=LimitsSpec, description="bounds that turn a hang into a verdict"
    )
    expect: ExpectSpec | None = Field(
        default=None,
        description="what every target must show (parity run --record writes it)",
    )

    _file: str = PrivateAttr(default="<memory>")
    _lines: LineMap = PrivateAttr(default_factory=dict)

    @property
    def file(self) -> str:
        """The file this scenario was loaded from (``<memory>`` when built in code)."""
        return self._file

    def attach_source(self, file: str, lines: LineMap) -> None:
        """Record where this scenario came from (called by the loader)."""
        self._file = file
        self._lines = lines

    def line_of(self, path: Path) -> int | None:
        """The line of ``path`` (or of its nearest present ancestor) in the file."""
        return line_of(self._lines, path) if self._lines else None

    def location(self, path: Path = ("id",)) -> str:
        """``file:line`` of ``path``; the ``id:`` line when the path is not in the file."""
        line = self.line_of(path) if path else None
        if line is None:
            line = self.line_of(("id",))
        return self._file if line is None else f"{self._file}:{line}"

    def request_index(self, request_id: str) -> int | None:
        for index, request in enumerate(self.requests):
            if request.id == request_id:
                return index
        return None

    def request_location(self, request_id: str, key: str | None = None) -> str:
        """``file:line`` of a request (or one of its keys); the ``id:`` line if unknown."""
        index = self.request_index(request_id)
        if index is None:
            return self.location()
        return self.location(("requests", index) if key is None else ("requests", index, key))

    @property
    def runs_at_scheduler_tier(self) -> bool:
        return self.tier in ("scheduler", "both")


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file (committed as ``scenarios/schema.json``)."""
    schema = Scenario.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "vllm-parity scenario"
    return schema
