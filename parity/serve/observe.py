"""What the serve tier records: per request, per target; SSE and Prometheus parsing.

``RequestObservation`` is one request as a client saw it: timings (ms since its send), every
SSE frame with its arrival time and raw text, bytes, status, the parsed result (finish_reason,
stop_reason, usage, token ids, text, reasoning vs content, error body) and its outcome:

- ``completed``: a response with status < 400 read to its end (``[DONE]`` for a stream; an
  error frame inside a 200 stream is still ``completed``, with ``error`` set);
- ``http_error``: status >= 400 (vLLM validates before any SSE byte: spec B6.3);
- ``zero_byte_hang``: the server is alive, the request outstanding, and no body byte arrived
  while nothing progressed for ``stall_s``;
- ``mid_stream_stall``: some body bytes, then nothing progressed for ``stall_s``;
- ``disconnected``: the connection ended early (or a stream ended without ``[DONE]``) while the
  server stayed alive;
- ``timeout``: still progressing when ``request_timeout_s`` ran out (slow, not stalled);
- ``startup_refused`` / ``startup_timeout``: the target never served;
- ``crashed``: the server process died while the request was outstanding.

"Nothing progressed" means no byte delivered to this request and the server's
``vllm:generation_tokens_total`` unchanged (docs/failure-classes.md: detect stalls by delivery, not
a long fixed timeout; a non-streaming request that is generating is not a hang).

Upstream formats: SSE framing and chunk shapes of ``vllm/entrypoints/openai/chat_completion/
serving.py`` and ``completion/serving.py``; metric names of ``vllm/v1/metrics/loggers.py``
(pin 0.32.0).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, get_args

from prometheus_client.parser import text_string_to_metric_families

from parity._codec import JsonMixin
from parity.machine import LoadSample
from parity.scenario import ServeOutcome

OUTCOMES: tuple[str, ...] = get_args(ServeOutcome)  # the scenario schema's list, one definition
STALL_OUTCOMES = ("zero_byte_hang", "mid_stream_stall")
PROGRESS_COUNTER = "vllm:generation_tokens_total"
_DROPPED_LABELS = frozenset({"engine", "model_name"})
REASONING_KEYS = ("reasoning", "reasoning_content")


@dataclass(frozen=True, slots=True)
class SSEFrame(JsonMixin):
    """One SSE event as received: arrival time (ms since send) and its raw text."""

    t_ms: float
    raw: str  # without the blank line that ends it

    @property
    def data(self) -> str | None:
        """The joined ``data:`` lines (None for a comment-only frame)."""
        lines = [ln[5:].removeprefix(" ") for ln in self.raw.splitlines() if ln.startswith("data:")]
        return "\n".join(lines) if lines else None

    @property
    def done(self) -> bool:
        return self.data == "[DONE]"

    def payload(self) -> Any:
        """The frame's JSON (None for ``[DONE]``, comments, or text that is not JSON)."""
        data = self.data
        if data is None or data == "[DONE]":
            return None
        try:
            return json.loads(data)
        except ValueError:
            return None


@dataclass(frozen=True, slots=True)
class HealthSample(JsonMixin):
    """One ``GET /health``: ms since the run started, status (None: no answer)."""

    t_ms: float
    status: int | None
    latency_ms: float | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class MetricsSnapshot(JsonMixin):
    """One ``GET /metrics``: every counter/gauge sample (histograms as _sum/_count)."""

    t_ms: float
    samples: dict[str, float] = field(default_factory=dict)  # 'name{label="v"}' -> value
    error: str | None = None

    def value(self, name: str) -> float | None:
        """The sample ``name`` (unlabelled after dropping engine/model_name), or the sum of
        its labelled samples."""
        if name in self.samples:
            return self.samples[name]
        labelled = [v for k, v in self.samples.items() if k.startswith(name + "{")]
        return sum(labelled) if labelled else None

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """``{label value: sample}`` for a labelled metric, e.g. waiting by reason."""
        found: dict[str, float] = {}
        prefix = f'{name}{{{label}="'
        for key, value in self.samples.items():
            if key.startswith(prefix):
                found[key[len(prefix) :].split('"', 1)[0]] = value
        return found

    @property
    def running(self) -> float | None:
        return self.value("vllm:num_requests_running")

    @property
    def waiting(self) -> float | None:
        return self.value("vllm:num_requests_waiting")

    @property
    def waiting_by_reason(self) -> dict[str, float]:
        return self.by_label("vllm:num_requests_waiting_by_reason", "reason")

    @property
    def kv_cache_usage_perc(self) -> float | None:
        return self.value("vllm:kv_cache_usage_perc")

    @property
    def num_preemptions(self) -> float | None:
        return self.value("vllm:num_preemptions_total")

    @property
    def generation_tokens(self) -> float | None:
        return self.value(PROGRESS_COUNTER)

    def summary(self) -> dict[str, Any]:
        """The operator's view: running, waiting (by reason), KV usage, preemptions, tokens."""
        return {
            "running": self.running,
            "waiting": self.waiting,
            "waiting_by_reason": self.waiting_by_reason,
            "kv_cache_usage_perc": self.kv_cache_usage_perc,
            "num_preemptions": self.num_preemptions,
            "generation_tokens": self.generation_tokens,
        }


@dataclass(frozen=True, slots=True)
class StallEvidence(JsonMixin):
    """Sampled while the stalled request was still open (before the client closed it)."""

    t_verdict_ms: float  # since send
    t_last_progress_ms: float  # since send: last byte, or last counter change seen
    health: HealthSample | None
    metrics: MetricsSnapshot | None
    server_alive: bool
    load: LoadSample | None = None  # the machine's load at the verdict


@dataclass(frozen=True, slots=True)
class ChoiceResult(JsonMixin):
    """The result fields of one more choice (``n > 1``: index 1 and up)."""

    index: int
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: tuple[int, ...] | None = None
    text: str | None = None  # completions text, or chat content
    reasoning: str | None = None
    token_ids_derived: bool = False  # token_ids tokenized from the text (parity.serve.derive)
    text_token_ids: tuple[int, ...] | None = None  # the text tokenized, for like-for-like


@dataclass(frozen=True, slots=True)
class Parsed(JsonMixin):
    """The result fields of a response, from its body or its SSE frames: choice 0 in the
    fields, the other choices (``n > 1``) in ``other_choices`` by index."""

    finish_reason: str | None = None
    stop_reason: int | str | None = None
    usage: dict[str, Any] | None = None
    token_ids: tuple[int, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    text: str | None = None  # completions text, or chat content (None: null / never sent)
    reasoning: str | None = None
    reasoning_key: str | None = None  # which field carried it: reasoning | reasoning_content
    role: str | None = None
    error: dict[str, Any] | None = None  # the error object (HTTP error body or error frame)
    num_choices: int = 0
    num_token_frames: int = 0  # frames that carried a token (streaming)
    other_choices: tuple[ChoiceResult, ...] = ()  # index 1 and up, in index order
    # token_ids were not sent by the server but tokenized from the text with the scenario
    # model's tokenizer (parity.serve.derive; exact for the scripted model)
    token_ids_derived: bool = False
    text_token_ids: tuple[int, ...] | None = None  # the text tokenized (both sides alike)


@dataclass(frozen=True, slots=True)
class RequestObservation(JsonMixin):
    """One request copy as the client saw it. Times are ms since its send."""

    request_id: str  # the scenario id, or id#k for a repeated copy
    spec_id: str
    endpoint: str
    stream: bool
    outcome: str  # one of OUTCOMES
    detail: str  # one line: why this outcome
    request_body: dict[str, Any] = field(default_factory=dict)
    t_send_ms: float = 0.0  # since the run started
    t_headers_ms: float | None = None  # status line and headers (parsed together by h11)
    t_first_byte_ms: float | None = None  # first body byte
    t_first_token_ms: float | None = None
    t_last_byte_ms: float | None = None
    t_end_ms: float | None = None  # body complete, or the verdict
    t_last_progress_ms: float | None = None
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    num_bytes: int = 0
    body: str | None = None  # non-streaming body text
    frames: tuple[SSEFrame, ...] = ()
    done: bool = False  # saw data: [DONE]
    result: Parsed = field(default_factory=Parsed)
    stall: StallEvidence | None = None
    exception: str | None = None  # client-side transport error, if any

    @property
    def token_ids(self) -> tuple[int, ...] | None:
        return self.result.token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.result.token_ids or ())


def parse_metrics(text: str, t_ms: float) -> MetricsSnapshot:
    """A snapshot of ``vllm:`` samples (buckets and ``_created`` dropped; engine and
    model_name labels dropped so targets compare; equal keys summed)."""
    samples: dict[str, float] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError) as exc:
        return MetricsSnapshot(t_ms=t_ms, error=f"unparsable /metrics: {exc}")
    for family in families:
        for sample in family.samples:
            name = sample.name
            if not name.startswith("vllm:") or name.endswith(("_bucket", "_created")):
                continue
            labels = {k: v for k, v in sample.labels.items() if k not in _DROPPED_LABELS}
            inner = ",".join(f'{k}="{labels[k]}"' for k in sorted(labels))
            key = f"{name}{{{inner}}}" if inner else name
            samples[key] = samples.get(key, 0.0) + float(sample.value)
    return MetricsSnapshot(t_ms=t_ms, samples=samples)


def split_sse(buffer: bytearray) -> list[str]:
    """Remove and return the complete events at the start of ``buffer`` (UTF-8 text)."""
    events: list[str] = []
    while True:
        data = bytes(buffer)
        cut, sep = _event_end(data)
        if cut < 0:
            return events
        events.append(data[:cut].decode("utf-8", "replace").replace("\r\n", "\n"))
        del buffer[: cut + sep]


def _event_end(data: bytes) -> tuple[int, int]:
    best = (-1, 0)
    for sep in (b"\n\n", b"\r\n\r\n"):
        index = data.find(sep)
        if index >= 0 and (best[0] < 0 or index < best[0]):
            best = (index, len(sep))
    return best


def parse_body(text: str, status: int | None) -> Parsed:
    """The result fields of a non-streaming body (or of an error body)."""
    try:
        data = json.loads(text)
    except ValueError:
        return Parsed(error={"raw": text[:2000]}) if (status or 0) >= 400 else Parsed()
    if not isinstance(data, dict):
        return Parsed()
    if (status or 0) >= 400 or "error" in data and "choices" not in data:
        error = data.get("error", data)
        return Parsed(error=error if isinstance(error, dict) else {"message": error})
    choices = sorted(
        (c for c in data.get("choices") or [] if isinstance(c, dict)),
        key=lambda c: int(c.get("index", 0)),
    )
    choice = choices[0] if choices else {}
    message = choice.get("message")
    reasoning, key = _reasoning(message or {})
    prompt_ids = data.get("prompt_token_ids") or choice.get("prompt_token_ids")
    return Parsed(
        other_choices=tuple(_choice_result(c) for c in choices[1:]),
        finish_reason=choice.get("finish_reason"),
        stop_reason=choice.get("stop_reason"),
        usage=data.get("usage"),
        token_ids=_ids(choice.get("token_ids")),
        prompt_token_ids=_ids(prompt_ids),
        text=message.get("content") if message is not None else choice.get("text"),
        reasoning=reasoning,
        reasoning_key=key,
        role=message.get("role") if message is not None else None,
        num_choices=len(choices),
    )


def _choice_result(choice: dict[str, Any]) -> ChoiceResult:
    message = choice.get("message")
    return ChoiceResult(
        index=int(choice.get("index", 0)),
        finish_reason=choice.get("finish_reason"),
        stop_reason=choice.get("stop_reason"),
        token_ids=_ids(choice.get("token_ids")),
        text=message.get("content") if isinstance(message, dict) else choice.get("text"),
        reasoning=_reasoning(message)[0] if isinstance(message, dict) else None,
    )


def parse_frames(frames: tuple[SSEFrame, ...]) -> Parsed:
    """The result fields accumulated over a stream's frames, per choice index."""
    acc = _StreamAccumulator()
    for frame in frames:
        payload = frame.payload()
        if isinstance(payload, dict):
            acc.add(payload)
    return acc.result()


def frame_has_token(payload: Any) -> bool:
    """True when a chunk carries generated output (token ids, text, content or reasoning)."""
    if not isinstance(payload, dict):
        return False
    for choice in payload.get("choices") or []:
        if choice.get("token_ids") or choice.get("text"):
            return True
        delta = choice.get("delta") or {}
        if delta.get("content") or any(delta.get(k) for k in REASONING_KEYS):
            return True
    return False


class _ChoiceStream:
    """One choice's pieces over a stream."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.text: list[str] | None = None
        self.reasoning: list[str] | None = None
        self.tokens: list[int] | None = None

    def add(self, choice: dict[str, Any]) -> None:
        if choice.get("token_ids"):
            self.tokens = (self.tokens or []) + list(choice["token_ids"])
        if choice.get("finish_reason") is not None:
            self.fields["finish_reason"] = choice["finish_reason"]
            self.fields["stop_reason"] = choice.get("stop_reason")
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if piece is not None:
            self.text = (self.text or []) + [piece]
        if isinstance(delta, dict):
            if delta.get("role"):
                self.fields["role"] = delta["role"]
            reasoning, key = _reasoning(delta)
            if reasoning is not None:
                self.reasoning = (self.reasoning or []) + [reasoning]
                self.fields["reasoning_key"] = key

    def values(self) -> dict[str, Any]:
        return {
            "token_ids": tuple(self.tokens) if self.tokens is not None else None,
            "text": "".join(self.text) if self.text is not None else None,
            "reasoning": "".join(self.reasoning) if self.reasoning is not None else None,
            **self.fields,
        }


class _StreamAccumulator:
    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.choices: dict[int, _ChoiceStream] = {}
        self.token_frames = 0

    def add(self, payload: dict[str, Any]) -> None:
        if "error" in payload and "choices" not in payload:
            error = payload["error"]
            self.fields["error"] = error if isinstance(error, dict) else {"message": error}
        if payload.get("usage"):
            self.fields["usage"] = payload["usage"]
        if payload.get("prompt_token_ids") and "prompt_token_ids" not in self.fields:
            self.fields["prompt_token_ids"] = _ids(payload["prompt_token_ids"])
        self.token_frames += frame_has_token(payload)
        for choice in payload.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            if choice.get("prompt_token_ids") and "prompt_token_ids" not in self.fields:
                self.fields["prompt_token_ids"] = _ids(choice["prompt_token_ids"])
            index = int(choice.get("index", 0))
            self.choices.setdefault(index, _ChoiceStream()).add(choice)

    def result(self) -> Parsed:
        first = self.choices.get(0, _ChoiceStream()).values()
        others = []
        for index in sorted(i for i in self.choices if i != 0):
            values = self.choices[index].values()
            values.pop("role", None)
            values.pop("reasoning_key", None)
            others.append(ChoiceResult(index=index, **values))
        return Parsed(
            num_choices=len(self.choices),
            num_token_frames=self.token_frames,
            other_choices=tuple(others),
            **first,
            **self.fields,
        )


def _reasoning(message: dict[str, Any]) -> tuple[str | None, str | None]:
    for key in REASONING_KEYS:
        if message.get(key) is not None:
            return message[key], key
    return None, None


def _ids(value: Any) -> tuple[int, ...] | None:
    return tuple(int(v) for v in value) if isinstance(value, list) else None
