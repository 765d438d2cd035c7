"""What a started server accepts: its declared capabilities, and a probe for ``"auto"`` ones.

A capability (``parity.targets.defs.CAPABILITIES``) is a vLLM extension a target may lack: the
server's ``/metrics`` with vLLM's metric names, ``GET /debug/scheduler``, or one request field
of vLLM's that the OpenAI API does not have (``return_token_ids``, ``ignore_eos``,
``min_tokens``, ...). A target declares each as true, false or ``"auto"``; an ``"auto"`` one is
probed once per target and run, on the first server that starts: a GET for the endpoints, a
one-token request carrying only that field (neutral value) for a request field. Accepted means
a status below 400 (and, for ``return_token_ids``, token ids in the answer). A server that
accepts a field and ignores it is then a divergence, not unsupported: that is its behaviour.

Every probe is bounded (``PROBE_TIMEOUT_S`` each).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from parity.targets.defs import CAPABILITIES

PROBE_TIMEOUT_S = 30.0
PROBE_ATTEMPTS = 3
# field -> (endpoint, neutral value): the value changes nothing about the one-token answer
FIELD_PROBES: dict[str, tuple[str, Any]] = {
    "return_token_ids": ("completions", True),
    "ignore_eos": ("completions", False),
    "min_tokens": ("completions", 0),
    "stop_token_ids": ("completions", []),
    "priority": ("completions", 0),
    "top_k": ("completions", -1),
    "min_p": ("completions", 0.0),
    "repetition_penalty": ("completions", 1.0),
    "include_stop_str_in_output": ("completions", False),
    "skip_special_tokens": ("completions", True),
    "include_reasoning": ("chat", True),
    "chat_template_kwargs": ("chat", {}),
    "bad_words": ("completions", []),
    "allowed_token_ids": ("completions", None),
    "truncate_prompt_tokens": ("completions", None),
    "repetition_detection": ("completions", None),
    "thinking_token_budget": ("completions", None),
    "use_beam_search": ("completions", False),
    "length_penalty": ("completions", 1.0),
}


def capabilities(handle: Any, cache: dict[str, dict[str, bool]]) -> dict[str, bool]:
    """Every capability of ``handle``'s target as a bool: declared ones as declared, ``auto``
    ones probed on this server (once per target label: ``cache``)."""
    declared = {name: handle.target.accepts(name) for name in CAPABILITIES}
    unknown = [name for name, value in declared.items() if value is None]
    probed = cache.get(handle.label)
    if unknown and probed is None:
        probed = cache[handle.label] = probe(handle.url, handle.model_name, unknown)
    return {
        name: bool(value if value is not None else (probed or {}).get(name))
        for name, value in declared.items()
    }


def probe(url: str, model: str, names: list[str]) -> dict[str, bool]:
    """Probe ``names`` on the server at ``url`` (see the module docstring)."""
    found: dict[str, bool] = {}
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        served = _served_model(client, url) or model
        for name in names:
            found[name] = _probe_one(client, url, served, name)
    return found


def _probe_one(client: httpx.Client, url: str, model: str, name: str) -> bool:
    """One capability; a transport error (a busy machine) is retried, never read as "no"
    until the last attempt."""
    for attempt in range(PROBE_ATTEMPTS):
        try:
            return _accepts(client, url, model, name)
        except httpx.HTTPError:
            if attempt == PROBE_ATTEMPTS - 1:
                return False
    return False


def _accepts(client: httpx.Client, url: str, model: str, name: str) -> bool:
    if name == "metrics":
        resp = client.get(f"{url}/metrics")
        return resp.status_code == 200 and "vllm:" in resp.text
    if name == "debug_scheduler":
        resp = client.get(f"{url}/debug/scheduler")
        return resp.status_code == 200 and resp.headers.get("content-type", "").startswith(
            "application/json"
        )
    endpoint, value = FIELD_PROBES[name]
    body: dict[str, Any] = {"model": model, "max_tokens": 1, "temperature": 0.0, name: value}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "a"}]
        resp = client.post(f"{url}/v1/chat/completions", json=body)
    else:
        body["prompt"] = "a"
        resp = client.post(f"{url}/v1/completions", json=body)
    if resp.status_code >= 400:
        return False
    if name == "return_token_ids":
        return _has_token_ids(resp)
    return True


def _has_token_ids(resp: httpx.Response) -> bool:
    try:
        data = resp.json()
    except ValueError:
        return False
    choices = data.get("choices") if isinstance(data, Mapping) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return False
    return "token_ids" in choices[0]


def _served_model(client: httpx.Client, url: str) -> str | None:
    try:
        data = client.get(f"{url}/v1/models").json()
        return str(data["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None


def needs(requests: Any, expect: Any) -> list[tuple[str, str]]:
    """The capabilities a scenario's requests and expectations need: (capability, what needs
    it), in a stable order."""
    found: list[tuple[str, str]] = []
    for request in requests:
        for field in request.extensions:
            found.append((field, f"request {request.id} sets {field}"))
    if expect is not None and getattr(expect, "min_preemptions", None) is not None:
        found.append(("metrics", "expect.min_preemptions reads vllm:num_preemptions"))
    if expect is not None and getattr(expect, "output_token_ids", None):
        found.append(("return_token_ids", "expect.output_token_ids needs the generated ids"))
    return found


def missing(requests: Any, expect: Any, accepted: Mapping[str, bool]) -> str | None:
    """Why a target with ``accepted`` capabilities cannot run the scenario, or None."""
    for capability, why in needs(requests, expect):
        if not accepted.get(capability, False):
            return f"{why}, a vLLM extension the target does not accept"
    return None
