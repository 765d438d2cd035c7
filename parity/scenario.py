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
# serve tier: parity.serve.observe.OUTCOMES
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


class ConfigSpec(_Strict):
    """Engine arguments, named as vLLM's (``--block-size`` is ``block_size``)."""

    model: str | None = Field(default=None, description="model folder; default: the scripted model")
    dtype: Literal["auto", "half", "float16", "bfloat16", "float", "float32"] = "auto"
    block_size: PositiveInt = 16
    num_gpu_blocks_override: NonNegativeInt | None = Field(
        default=None, description="KV blocks, null block included (required at the scheduler tier)"
    )
    max_model_len: MaxModelLen | None = Field(
        default=None, description="int, or auto / -1 (auto-fit); unset: derived from the model"
    )
    max_num_seqs: PositiveInt = 256
    max_num_batched_tokens: PositiveInt | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    long_prefill_token_threshold: NonNegativeInt = 0
    seed: int = 0
    # serve tier
    reasoning_parser: str | None = None
    extra_args: list[str] = Field(default_factory=list, description="extra server flags")


class Message(_Strict):
    """One chat message (serve tier)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


class RequestSpec(_Strict):
    """One request. Exactly one of ``prompt_token_ids``, ``prompt``, ``messages``."""

    id: RequestId
    prompt_token_ids: list[NonNegativeInt] | None = Field(default=None, min_length=1)
    prompt: str | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)
    max_tokens: NonNegativeInt | None = Field(
        default=None, description="required at the scheduler tier"
    )
    ignore_eos: bool = False
    min_tokens: NonNegativeInt = 0
    stop_token_ids: list[NonNegativeInt] = Field(default_factory=list)
    priority: int = 0
    at_step: NonNegativeInt = Field(
        default=0, description="scheduler tier: added just before step at_step + 1"
    )
    # serve tier
    endpoint: Literal["completions", "chat"] | None = None
    model: str | None = Field(
        default=None, description="serve tier: the body's model (default: the served name)"
    )
    stream: bool = False
    stream_options: dict[str, bool] | None = None
    at_ms: NonNegativeFloat | None = None
    repeat: PositiveInt = 1
    concurrency: PositiveInt | None = None
    max_completion_tokens: NonNegativeInt | None = None
    n: PositiveInt | None = Field(
        default=None, description="serve tier: choices per request (each compared by index)"
    )
    temperature: NonNegativeFloat | None = None
    top_p: PositiveFloat | None = None
    top_k: int | None = None
    min_p: NonNegativeFloat | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: PositiveFloat | None = None
    stop: str | list[str] | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    logprobs: bool | NonNegativeInt | None = None
    top_logprobs: NonNegativeInt | None = None
    echo: bool | None = None
    return_token_ids: bool | None = None
    include_reasoning: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None


SCHEDULER_REQUEST_KEYS = frozenset(
    {"id", "prompt_token_ids", "max_tokens", "ignore_eos", "min_tokens", "stop_token_ids"}
    | {"priority", "at_step"}
)


class LimitsSpec(_Strict):
    """Bounds that turn a hang into a verdict."""

    max_steps: PositiveInt = 1000
    stall_steps: PositiveInt = Field(
        default=50, description="no progress for this many steps = wedged"
    )
    # serve tier
    startup_timeout_s: PositiveFloat | None = None
    request_timeout_s: PositiveFloat | None = None
    stall_s: PositiveFloat | None = None
    latency_tolerance_ms: PositiveFloat | None = Field(
        default=None,
        description="serve tier: compare time to first token and end within this many ms "
        "(unset: timing is not compared)",
    )
    logprob_tolerance: NonNegativeFloat = Field(
        default=1e-3, description="serve tier: absolute tolerance on logprob values"
    )
    preemptions_tolerance: NonNegativeInt = Field(
        default=0,
        description="serve tier: allowed difference of the vllm:num_preemptions delta "
        "(arrival timing over HTTP may change how many preemptions a load causes)",
    )


class StepExpect(_Strict):
    """Expected fields of one StepTrace (each compared whole; unset fields are not checked)."""

    num_scheduled_tokens: dict[str, int] | None = None
    scheduled_new_req_ids: list[str] | None = None
    scheduled_resumed_req_ids: list[str] | None = None
    scheduled_running_req_ids: list[str] | None = None
    preempted_req_ids: list[str] | None = None
    finished: dict[str, FinishReason] | None = None
    sampled_token_ids: dict[str, list[int]] | None = None
    block_ids: dict[str, list[int]] | None = None
    num_computed_tokens: dict[str, int] | None = None
    running: list[str] | None = None
    waiting: list[str] | None = None
    num_free_blocks: int | None = None


class ExpectSpec(_Strict):
    """What every target must show (checked per target, independently of the diff)."""

    outcome: dict[str, Outcome | ServeOutcome] = Field(default_factory=dict)
    finish_reason: dict[str, FinishReason] = Field(default_factory=dict)
    stop_reason: dict[str, int | str | None] = Field(default_factory=dict)
    num_output_tokens: dict[str, NonNegativeInt] = Field(default_factory=dict)
    output_token_ids: dict[str, list[int]] = Field(default_factory=dict)
    num_preemptions: dict[str, NonNegativeInt] = Field(default_factory=dict)
    finished_at_step: dict[str, PositiveInt] = Field(default_factory=dict)
    wedged_at_step: PositiveInt | None = Field(
        default=None, description="first step without progress"
    )
    steps: dict[PositiveInt, StepExpect] = Field(
        default_factory=dict, description="step number (1-based) -> expected StepTrace fields"
    )
    # serve tier (parity.serve.expect): per target, independently of the diff
    startup: Literal["started", "refused"] | None = Field(
        default=None, description="serve tier: the startup outcome every target must show"
    )
    startup_numbers: dict[str, int] = Field(
        default_factory=dict,
        description="serve tier: numbers of the startup log, e.g. estimated_max_model_len",
    )
    max_model_len: PositiveInt | None = Field(
        default=None, description="serve tier: /v1/models max_model_len"
    )
    status: dict[str, int] = Field(default_factory=dict, description="serve tier: HTTP status")
    error_param: dict[str, str | None] = Field(
        default_factory=dict, description="serve tier: error.param of the error body"
    )
    text: dict[str, str | None] = Field(
        default_factory=dict, description="serve tier: completion text or chat content"
    )
    reasoning: dict[str, str | None] = Field(
        default_factory=dict, description="serve tier: chat reasoning (null: none)"
    )
    num_choices: dict[str, NonNegativeInt] = Field(
        default_factory=dict, description="serve tier: choices returned (n)"
    )
    min_preemptions: NonNegativeInt | None = Field(
        default=None, description="serve tier: at least this many preemptions (metrics delta)"
    )


class Scenario(_Strict):
    """One scenario file. ``id`` equals the file stem."""

    id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$", max_length=100)
    description: str = Field(min_length=1)
    tier: Tier
    config: ConfigSpec = Field(default_factory=ConfigSpec)
    requests: list[RequestSpec] = Field(min_length=1)
    limits: LimitsSpec = Field(default_factory=LimitsSpec)
    expect: ExpectSpec | None = None

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
