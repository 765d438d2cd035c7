"""Rule 10: ``sampling``, a seeded request both sides completed from the same prompt with
different tokens (see ``parity.signatures`` for the rule). Upstream draws with one generator
per seeded request (``v1/sample/ops/topk_topp_sampler.py``, ``v1/worker/gpu_input_batch.py``),
so which tokens a seed gives depends on the release's sampler and on the model's logits; the
same seed on two releases need not give the same tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from parity.signatures.facts import Facts, as_number, dig

# The fields a different draw changes (the tokens, their text and logprobs, how the choice
# ended, how many tokens it has, the frames that carried them).
DRAWN_FIELDS = frozenset(
    {"token_ids", "output_token_ids", "text", "text_token_ids", "content", "logprobs"}
    | {"finish_reason", "stop_reason", "completion_tokens", "total_tokens", "num_output_tokens"}
    | {"num_token_frames", "frames", "choices", "other_choices"}
)
COMPLETED = frozenset({"completed", "finished"})


def sampling(f: Facts) -> str | None:
    if f.rid is None or not (f.names & DRAWN_FIELDS):
        return None
    seed = _seed(f, f.rid)
    if seed is None:
        return None
    observed = [f.observation(side, f.rid) for side in f.sides]
    if any(obs.get("outcome") not in COMPLETED for obs in observed):
        return None
    if not _same_prompt(f, observed):
        return None
    drawn = [_choices(obs) for obs in observed]
    if drawn[0] == drawn[1] or not all(drawn):
        return None
    return f"D: seed {seed}, same prompt, both completed, different tokens"


def draws_unseeded(body: Mapping[str, Any]) -> bool:
    """A request body that samples from the server's own generator: no ``seed``, a temperature
    that is not 0 (unset: the server's default, 1.0 at the pin without a model default), no
    ``top_k`` 1 and no beam search (neither draws). Such draws depend on which requests shared
    the server's steps; the serve tier confirms a difference in them on fresh servers
    (``parity.serve.suite.unseeded_draws``) and this rule leaves them alone."""
    return (
        body.get("seed") is None
        and as_number(body.get("temperature")) != 0
        and as_number(body.get("top_k")) != 1
        and not body.get("use_beam_search")
    )


def _seed(f: Facts, rid: str) -> Any:
    """The request's seed (scenario spec, else both sides' request bodies alike) unless the
    request is greedy (temperature 0: the seed draws nothing)."""
    spec = f.spec(rid)
    bodies = [f.observation(side, rid).get("request_body") or {} for side in f.sides]
    seed = spec.get("seed")
    if seed is None:
        seeds = {repr(b.get("seed")) for b in bodies if isinstance(b, Mapping)}
        seed = bodies[0].get("seed") if len(seeds) == 1 and isinstance(bodies[0], Mapping) else None
    temperature = spec.get("temperature")
    if temperature is None and isinstance(bodies[0], Mapping):
        temperature = bodies[0].get("temperature")
    if seed is None or as_number(temperature) == 0:
        return None
    return seed


def _same_prompt(f: Facts, observed: list[Mapping[str, Any]]) -> bool:
    """The scenario gave prompt token ids, or both sides report the same prompt (ids when
    both return them, else the prompt token count)."""
    ids = f.spec(f.rid or "").get("prompt_token_ids")
    if isinstance(ids, list | tuple) and ids:
        return True
    for path in (("result", "prompt_token_ids"), ("prompt_token_ids",)):
        seen = [dig(obs, path) for obs in observed]
        if all(isinstance(s, list | tuple) and s for s in seen):
            return list(seen[0]) == list(seen[1])
    counts = [
        dig(obs, ("result", "usage", "prompt_tokens")) or dig(obs, ("usage", "prompt_tokens"))
        for obs in observed
    ]
    return counts[0] is not None and counts[0] == counts[1]


def _choices(obs: Mapping[str, Any]) -> list[Any]:
    """Each choice's tokens (ids, else text), choice 0 first; [] when nothing was drawn."""
    result = obs.get("result")
    if not isinstance(result, Mapping):
        ids = obs.get("output_token_ids")
        return [list(ids)] if isinstance(ids, list | tuple) and ids else []
    choices = [result, *(c for c in result.get("other_choices") or () if isinstance(c, Mapping))]
    drawn = [_tokens(c) for c in choices]
    return drawn if any(d is not None for d in drawn) else []


def _tokens(choice: Mapping[str, Any]) -> Any:
    ids = choice.get("token_ids") or choice.get("text_token_ids")
    if isinstance(ids, list | tuple) and ids:
        return list(ids)
    return choice.get("text")
