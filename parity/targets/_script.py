"""The script the scheduler-tier targets sample from, and the outputs the harness sends workers.

In-process, both fake runners keep one incremental ``ScriptState`` per request
(``contract.scripted.script``), and the script memoises its rankings process-wide, so the module
itself is the fastest shared script: a whole-context cache on top would only force the runners
back to O(n) calls.

A protocol worker (``parity/targets/worker.py``) gets no script: each ``submit`` carries the
request's ``output_token_ids``, the greedy token at each of its ``max_tokens`` output positions
(``contract.scripted.script.greedy_outputs``), with upstream's ``min_tokens`` masking of
``all_stop_token_ids``: the request's stop ids plus every EOS id of the model folder (the
``config.json`` one and the ``generation_config.json`` ones, added even under ``ignore_eos``:
``vllm/sampling_params.py:772-800`` at the pin).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from types import ModuleType


def shared_script() -> ModuleType:
    """The script module (its ranking memo is shared by every target of the process)."""
    from contract.scripted import script

    return script


def _eos_ids(document: dict[str, object]) -> set[int]:
    value = document.get("eos_token_id")
    if isinstance(value, int):
        return {value}
    if isinstance(value, list):
        return {v for v in value if isinstance(v, int)}
    return set()


@functools.lru_cache(maxsize=16)
def model_eos_ids(model_dir: str) -> frozenset[int]:
    """Every EOS id of the model folder (``config.json`` and ``generation_config.json``)."""
    found: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            found |= _eos_ids(json.loads(path.read_text(encoding="utf-8")))
    return frozenset(found)


def output_token_ids(
    prompt_token_ids: Sequence[int],
    max_tokens: int,
    min_tokens: int,
    stop_token_ids: Iterable[int],
    eos_ids: Iterable[int],
) -> list[int]:
    """The scripted token at each of ``max_tokens`` output positions (see the docstring)."""
    from contract.scripted.script import greedy_outputs

    masked = set(stop_token_ids) | set(eos_ids)
    return greedy_outputs(prompt_token_ids, max_tokens, min(min_tokens, max_tokens), masked)
