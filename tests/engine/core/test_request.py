"""Request, finish reasons, stop checks and the waiting queues.

Covers engine/request.py, engine/core/sched/utils.py and engine/core/sched/request_queue.py
(they mirror v1/request.py, v1/core/sched/utils.py and v1/core/sched/request_queue.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.core.sched.request_queue import FCFSRequestQueue, PriorityRequestQueue
from engine.core.sched.utils import check_sequence_repetition, check_stop, remove_all
from engine.request import FinishReason, Request, RequestStatus, min_tokens_banned_ids
from engine.sampling_params import RepetitionDetectionParams, SamplingParamsError

pytestmark = pytest.mark.timeout(30)


def test_finish_reason_strings_and_status_mapping() -> None:
    assert [str(r) for r in FinishReason] == ["stop", "length", "abort", "error", "repetition"]
    assert RequestStatus.get_finished_reason(RequestStatus.FINISHED_IGNORED) == FinishReason.LENGTH
    assert RequestStatus.get_finished_reason(RequestStatus.PREEMPTED) is None
    assert not RequestStatus.is_finished(RequestStatus.PREEMPTED)
    assert RequestStatus.is_finished(RequestStatus.FINISHED_ABORTED)


def test_request_counts_and_requires_max_tokens(factories: Any) -> None:
    request = factories.make_request("a", [1, 2, 3], 5)
    request.append_output_token_ids([7, 8])
    request.append_output_token_ids(9)
    assert request.num_tokens == 6 and request.num_output_tokens == 3
    assert request.all_token_ids == [1, 2, 3, 7, 8, 9]
    params = factories.make_params()
    params.max_tokens = None
    with pytest.raises(ValueError, match="max_tokens"):
        Request("b", [1], params)
    with pytest.raises(ValueError, match="empty"):
        Request("c", [], factories.make_params())


def _stopped(factories: Any, token: int, **params: object) -> tuple[bool, Request]:
    max_model_len = params.pop("max_model_len", 100)
    request = factories.make_request("a", [1, 2, 3], params.pop("max_tokens", 5), **params)
    request.append_output_token_ids(token)
    return check_stop(request, max_model_len), request  # type: ignore[arg-type]


def test_check_stop_order_and_reasons(factories: Any) -> None:
    eos = factories.EOS
    stopped, request = _stopped(factories, eos)
    assert stopped and request.status == RequestStatus.FINISHED_STOPPED
    assert request.stop_reason is None
    stopped, request = _stopped(factories, eos, ignore_eos=True)
    assert not stopped
    stopped, request = _stopped(factories, 42, stop_token_ids=[42], max_tokens=1)
    assert stopped and request.stop_reason == 42  # stop id wins over the length cap
    stopped, request = _stopped(factories, 7, max_tokens=1)
    assert stopped and request.status == RequestStatus.FINISHED_LENGTH_CAPPED
    stopped, request = _stopped(factories, 7, max_model_len=4)
    assert stopped and request.get_finished_reason() == FinishReason.LENGTH


def test_check_stop_ignores_min_tokens(factories: Any) -> None:
    stopped, _ = _stopped(factories, factories.EOS, min_tokens=3)
    assert stopped  # upstream masks EOS in the sampler, not in check_stop


@pytest.mark.parametrize(
    ("tokens", "sizes", "found"),
    [
        ([1, 2, 1, 2], (2, 0, 2), True),  # a pair twice
        ([1, 2, 1, 2], (1, 0, 2), False),  # no single token twice at the end
        ([3, 1, 2, 1, 2], (3, 2, 2), True),  # size 2 inside the range
        ([5, 5, 5], (1, 0, 3), True),
        ([5, 5], (1, 0, 3), False),  # too short for three runs
        ([1, 2, 2], (2, 0, 2), True),  # size 1 is tried first
        ([9, 1, 2, 3, 1, 2, 3], (3, 0, 2), True),
        ([1, 1, 2, 3, 1, 2, 3], (3, 2, 2), True),
        # the search ends at the first size that cannot fit (upstream's loop), so a longer
        # pattern is not reached: sizes 1 and 2 miss, size 3 needs 6 tokens, 5 are there
        ([4, 1, 2, 1, 2], (3, 3, 2), False),
        ([1, 2, 1, 2], (0, 0, 2), False),  # max_pattern_size 0 disables
        ([1, 1], (1, 0, 1), False),  # min_count below 2 never matches
    ],
)
def test_check_sequence_repetition(tokens: list[int], sizes: tuple[int, int, int],
                                   found: bool) -> None:  # fmt: skip
    params = RepetitionDetectionParams(*sizes)
    assert check_sequence_repetition(tokens, params) is found


def test_repetition_stops_after_min_tokens(factories: Any) -> None:
    detection = RepetitionDetectionParams(max_pattern_size=1, min_count=2)
    request = factories.make_request("a", [1], 10, min_tokens=3)
    request.sampling_params.repetition_detection = detection
    request.append_output_token_ids(7)
    assert not check_stop(request, 100)
    request.append_output_token_ids(7)
    assert not check_stop(request, 100)  # repeated, but 2 < min_tokens
    request.append_output_token_ids(7)
    assert check_stop(request, 100)
    assert request.get_finished_reason() == FinishReason.REPETITION
    assert request.stop_reason == "repetition_detected"


def test_repetition_detection_sizes_are_checked() -> None:
    with pytest.raises(SamplingParamsError, match="min_pattern_size <= max_pattern_size"):
        RepetitionDetectionParams(max_pattern_size=1, min_pattern_size=2).verify()
    with pytest.raises(SamplingParamsError, match="min_count must be >= 2"):
        RepetitionDetectionParams(max_pattern_size=1, min_count=1).verify()
    RepetitionDetectionParams().verify()  # all zero: disabled, accepted


def test_min_tokens_ban_includes_eos_even_under_ignore_eos(factories: Any) -> None:
    params = factories.make_params(ignore_eos=True, stop_token_ids=[5])
    assert params.eos_token_id is None
    assert min_tokens_banned_ids(params) == {5, factories.EOS}


def test_prefill_cached_tokens_reported_once(factories: Any) -> None:
    request = factories.make_request("a", [1, 2, 3], 5)
    request.record_prefix_hit(16)
    assert request.take_num_cached_tokens() == 16
    assert request.take_num_cached_tokens() is None
    again = factories.make_request("b", [1, 2, 3], 5)
    again.num_preemptions = 1
    again.record_prefix_hit(16)
    assert again.take_num_cached_tokens() == 0


def test_fcfs_queue_prepends_preempted(factories: Any) -> None:
    a, b, c = (factories.make_request(i, [1], 1) for i in "abc")
    queue = FCFSRequestQueue()
    queue.add_request(a)
    queue.add_request(b)
    queue.prepend_request(c)
    assert [r.request_id for r in queue] == ["c", "a", "b"] and queue.peek_request() is c
    queue.remove_requests([a])
    assert [queue.pop_request().request_id for _ in range(len(queue))] == ["c", "b"]
    assert not queue


def test_priority_queue_orders_by_priority_arrival_then_id(factories: Any) -> None:
    reqs = [
        factories.make_request("z", [1], 1, priority=1, arrival_time=0.0),
        factories.make_request("b", [1], 1, priority=0, arrival_time=2.0),
        factories.make_request("a", [1], 1, priority=0, arrival_time=2.0),
        factories.make_request("c", [1], 1, priority=0, arrival_time=1.0),
    ]
    queue = PriorityRequestQueue()
    for request in reqs:
        queue.prepend_request(request)
    assert [r.request_id for r in queue] == ["c", "a", "b", "z"]
    queue.remove_requests([reqs[2]])
    assert [queue.pop_request().request_id for _ in range(3)] == ["c", "b", "z"]
    with pytest.raises(IndexError):
        queue.peek_request()


def test_remove_all_keeps_order(factories: Any) -> None:
    reqs = [factories.make_request(i, [1], 1) for i in "abcd"]
    assert remove_all(list(reqs), [reqs[1], reqs[3]]) == [reqs[0], reqs[2]]
    assert remove_all(list(reqs), [reqs[0]]) == reqs[1:]
