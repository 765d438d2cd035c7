"""The output processor on its own: request states in, client outputs and core aborts out."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from contract.scripted import vocab
from engine.core.outputs import EngineCoreOutput
from engine.entrypoints.output_processor import (
    Delivery,
    NewRequest,
    OutputProcessor,
    ParentRequest,
    RequestOutputCollector,
    RequestOutputKind,
)
from engine.entrypoints.startup import load_tokenizer
from engine.entrypoints.stats import IterationStats
from engine.request import FinishReason, Request
from engine.request_output import RequestOutput
from engine.sampling_params import SamplingParams

PROMPT = [vocab.BOS, vocab.LOOP]


@pytest.fixture(scope="module")
def tokenizer(scripted_model_dir: Path) -> Any:
    return load_tokenizer(scripted_model_dir)


def add(
    processor: OutputProcessor,
    external_id: str,
    kind: RequestOutputKind,
    n: int = 1,
    **params: Any,
) -> tuple[RequestOutputCollector, list[str]]:
    """Add one client request (``n`` choices) the way AsyncLLM does; returns its collector and
    internal ids."""
    collector = RequestOutputCollector(kind, external_id)
    parent = ParentRequest(f"{external_id}-x", n, kind) if n > 1 else None
    ids = []
    for i in range(n):
        internal = f"{i}_{external_id}-x" if parent else f"{external_id}-x"
        if parent:
            parent.child_requests.add(internal)
        sampling = SamplingParams(max_tokens=16, temperature=0.0, **params)
        request = Request(internal, PROMPT, sampling, time.time(), 0)
        processor.add_request(NewRequest(request, external_id, i, None, kind, collector, parent))
        ids.append(internal)
    return collector, ids


def outputs_for(delivery: Delivery, collector: RequestOutputCollector) -> list[RequestOutput]:
    found = [item for target, item in delivery if target is collector]
    assert all(isinstance(item, RequestOutput) for item in found)
    return found  # type: ignore[return-value]


def test_delta_outputs_then_finish_forgets_the_request(tokenizer: Any) -> None:
    processor = OutputProcessor(tokenizer)
    collector, (rid,) = add(processor, "a", RequestOutputKind.DELTA)
    delivery: Delivery = []
    step = [EngineCoreOutput(rid, [vocab.TICK])]
    assert processor.process_outputs(step, time.time(), IterationStats(time.time()), delivery) == []
    done = [EngineCoreOutput(rid, [vocab.TOCK], FinishReason.LENGTH)]
    processor.process_outputs(done, time.time(), IterationStats(time.time()), delivery)
    outs = outputs_for(delivery, collector)
    assert [o.outputs[0].token_ids for o in outs] == [[vocab.TICK], [vocab.TOCK]]
    assert "".join(o.outputs[0].text for o in outs) == " tick tock"
    assert [o.finished for o in outs] == [False, True]
    assert outs[-1].outputs[0].finish_reason == "length"
    assert not processor.has_unfinished_requests()


def test_abort_by_external_id_finishes_every_choice_once(tokenizer: Any) -> None:
    processor = OutputProcessor(tokenizer)
    wanted, wanted_ids = add(processor, "a", RequestOutputKind.FINAL_ONLY, n=2)
    other, _ = add(processor, "b", RequestOutputKind.FINAL_ONLY)
    delivery: Delivery = []
    aborted = processor.abort_requests({"a"}, delivery)
    assert sorted(aborted) == sorted(wanted_ids)
    (out,) = outputs_for(delivery, wanted)  # non-streaming n=2: one output, both choices
    assert out.finished and [c.index for c in out.outputs] == [0, 1]
    assert {c.finish_reason for c in out.outputs} == {"abort"}
    assert outputs_for(delivery, other) == []
    assert processor.get_num_unfinished_requests() == 1


def test_abort_by_collector_and_abort_all(tokenizer: Any) -> None:
    processor = OutputProcessor(tokenizer)
    first, first_ids = add(processor, "same-id", RequestOutputKind.DELTA)
    second, second_ids = add(processor, "other", RequestOutputKind.DELTA, n=2)
    delivery: Delivery = []
    assert processor.abort_requests({first}, delivery) == first_ids
    assert [o.outputs[0].finish_reason for o in outputs_for(delivery, first)] == ["abort"]
    rest = processor.abort_requests(None, delivery)
    assert sorted(rest) == sorted(second_ids)
    assert len(outputs_for(delivery, second)) == 2  # streaming: one final delta per choice
    assert not processor.has_unfinished_requests()


def test_stop_string_finishes_the_request_and_asks_the_core_to_abort(tokenizer: Any) -> None:
    processor = OutputProcessor(tokenizer)
    collector, (rid,) = add(processor, "a", RequestOutputKind.FINAL_ONLY, stop=[" tock"])
    delivery: Delivery = []
    step = [EngineCoreOutput(rid, [vocab.TICK, vocab.TOCK, vocab.TICK])]
    reqs_to_abort = processor.process_outputs(step, time.time(), IterationStats(time.time()),
                                              delivery)  # fmt: skip
    assert reqs_to_abort == [rid]
    (out,) = outputs_for(delivery, collector)
    assert out.outputs[0].text == " tick"
    assert (out.outputs[0].finish_reason, out.outputs[0].stop_reason) == ("stop", " tock")
    assert not processor.has_unfinished_requests()


def test_a_refused_request_is_discarded_without_output(tokenizer: Any) -> None:
    processor = OutputProcessor(tokenizer)
    collector, (rid,) = add(processor, "a", RequestOutputKind.DELTA)
    processor.discard(rid)
    delivery: Delivery = []
    assert processor.abort_requests(None, delivery) == []
    assert delivery == [] and collector.output is None
