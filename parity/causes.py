"""Fold the divergences a root difference causes into the root's signature.

``parity.signatures`` classifies one divergence at a time. Some differences are only the
consequences of another one in the same run, and would otherwise be reported under a class
that names the symptom, not the cause: the ``metrics`` deltas of a request that one side
refused with a 400 (``max_tokens_clamp``), or every request of a server that advertises one
block more of ``max_model_len`` (``capacity_overhang``). ``classify_all`` classifies a run's
divergences (one pair of targets, one scenario) and then applies three folds, in this order:

F1 server root: when a divergence outside any request (``startup``, ``facts``, ``models``) is
   ``capacity_overhang``, the two servers run different capacity configs (one refused to start,
   or they advertise different ``max_model_len``), so every other divergence of the pair is its
   consequence and takes ``capacity_overhang`` (rule ``F1: consequence of <path>``).
F2 accounting: a ``metrics`` divergence of a per-request counter (``ACCOUNTED_METRICS``: tokens,
   successes by finish reason, the ``max_tokens`` parameter histogram, preemptions) is the
   consequence of the requests' differences when some request differs in what is accounted
   (``ACCOUNTING_FIELDS``, the path's last field: its outcome, HTTP status, error body as a
   whole, finish reason or token counts; not e.g. an error message's wording) and
   all such request divergences share one signature S that is neither ``metrics`` nor
   ``timing``: it takes S (rule ``F2: consequence of <path>``). Mixed signatures: no fold (the
   metric stays ``metrics``; which cause moved it is not decidable).
F3 same step (scheduler tier): an ``other`` divergence at step ``steps[i]`` takes the signature
   of the first divergence at that step that has one (not ``other``, ``metrics`` or
   ``timing``): the step's block ids, computed tokens, sampled tokens and free blocks follow
   from what the step scheduled (rule ``F3: consequence of <path>``).

A folded ``Classification.rule`` starts with ``F1:``/``F2:``/``F3:`` and names the root's path and
rule, so reports show why.
"""

from __future__ import annotations

from collections.abc import Sequence

from parity.results import Divergence
from parity.signatures import (
    Classification,
    Signature,
    SignatureContext,
    classify_divergence,
    request_id_of,
    split_path,
)
from parity.signatures.facts import SERVER_ANCHORS

ACCOUNTED_METRICS = (
    "vllm:num_preemptions_total",
    "vllm:generation_tokens_total",
    "vllm:prompt_tokens_total",
    "vllm:request_success_total",
    "vllm:request_params_max_tokens",
)
ACCOUNTING_FIELDS = frozenset(
    {"outcome", "status", "error", "finish_reason", "token_ids", "output_token_ids"}
    | {"completion_tokens", "prompt_tokens", "total_tokens", "num_output_tokens"}
)
_NOT_ROOTS = frozenset({Signature.METRICS, Signature.TIMING})
_NOT_STEP_ROOTS = _NOT_ROOTS | {Signature.OTHER}


def classify_all(
    divergences: Sequence[Divergence], context: SignatureContext | None = None
) -> list[Classification]:
    """The classification of each divergence of one pair's run, consequences folded (see the
    module docstring); same order as ``divergences``."""
    ctx = context or SignatureContext()
    found = [classify_divergence(d, ctx) for d in divergences]
    root = _server_root(divergences, found)
    if root is not None:
        return [
            c
            if i == root or c.signature is Signature.CAPACITY_OVERHANG
            else _folded("F1", divergences[root], found[root])
            for i, c in enumerate(found)
        ]
    found = _same_step(divergences, found)
    accounting = _accounting_root(divergences, found, ctx)
    if accounting is None:
        return found
    return [
        _folded("F2", divergences[accounting], found[accounting])
        if c.signature is Signature.METRICS and _accounted(d.path)
        else c
        for d, c in zip(divergences, found, strict=True)
    ]


def _server_root(divergences: Sequence[Divergence], found: Sequence[Classification]) -> int | None:
    for index, (divergence, classification) in enumerate(zip(divergences, found, strict=True)):
        segments = split_path(divergence.path)
        if (
            classification.signature is Signature.CAPACITY_OVERHANG
            and segments
            and segments[0] in SERVER_ANCHORS
        ):
            return index
    return None


def _same_step(
    divergences: Sequence[Divergence], found: list[Classification]
) -> list[Classification]:
    roots: dict[str, int] = {}
    for index, (divergence, classification) in enumerate(zip(divergences, found, strict=True)):
        step = _step_of(divergence.path)
        if step is not None and classification.signature not in _NOT_STEP_ROOTS:
            roots.setdefault(step, index)
    return [
        _folded("F3", divergences[roots[step]], found[roots[step]])
        if c.signature is Signature.OTHER and (step := _step_of(d.path)) in roots
        else c
        for d, c in zip(divergences, found, strict=True)
    ]


def _step_of(path: str) -> str | None:
    segments = split_path(path)
    if len(segments) >= 2 and segments[0] == "steps" and segments[1].startswith("["):
        return segments[1]
    return None


def _accounting_root(
    divergences: Sequence[Divergence], found: Sequence[Classification], ctx: SignatureContext
) -> int | None:
    """The first request divergence in what is accounted, when all of them share a signature."""
    roots = [
        i
        for i, d in enumerate(divergences)
        if found[i].signature not in _NOT_ROOTS and _request_field(d.path, ctx) in ACCOUNTING_FIELDS
    ]
    if not roots or len({found[i].signature for i in roots}) != 1:
        return None
    return roots[0]


def _accounted(path: str) -> bool:
    return any(segment.startswith(ACCOUNTED_METRICS) for segment in split_path(path))


def _request_field(path: str, ctx: SignatureContext) -> str | None:
    """The last field name of a request path (``requests.r1.usage.completion_tokens`` ->
    ``completion_tokens``); None for a path outside any request."""
    rid = request_id_of(path, list(ctx.requests))
    segments = split_path(path)
    if rid is None or rid not in segments:
        return None
    after = [s for s in segments[segments.index(rid) + 1 :] if not s.startswith("[")]
    return after[-1] if after else None


def _folded(rule: str, root: Divergence, classification: Classification) -> Classification:
    return Classification(
        classification.signature,
        f"{rule}: consequence of {root.path} ({classification.rule})",
    )
