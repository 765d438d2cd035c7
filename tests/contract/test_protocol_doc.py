"""The full exchange of docs/scheduler-protocol.md is real: replayed against our engine's
worker, every response matches the documented one (a string ending in "..." matches any text
it begins)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "scheduler-protocol.md"
PLACEHOLDER = "/abs/path/.cache/models/scripted"

pytestmark = pytest.mark.timeout(120)


def documented_exchange() -> list[tuple[str, str]]:
    """``(direction, json text)`` pairs of the doc's "A full exchange" block."""
    text = DOC.read_text(encoding="utf-8")
    block = text.split("## A full exchange", 1)[1].split("```", 2)[1]
    messages: list[tuple[str, str]] = []
    for line in block.splitlines():
        if line.startswith(("> ", "< ")):
            messages.append((line[0], line[2:]))
        elif line.startswith("   ") and messages:
            direction, body = messages[-1]
            messages[-1] = (direction, f"{body} {line.strip()}")
    return messages


def matches(documented: Any, actual: Any) -> bool:
    if isinstance(documented, str) and documented.endswith("..."):
        return isinstance(actual, str) and actual.startswith(documented[:-3].rstrip())
    if isinstance(documented, dict):
        return (
            isinstance(actual, dict)
            and documented.keys() == actual.keys()
            and all(matches(documented[k], actual[k]) for k in documented)
        )
    if isinstance(documented, list):
        return (
            isinstance(actual, list)
            and len(documented) == len(actual)
            and all(matches(d, a) for d, a in zip(documented, actual, strict=True))
        )
    return bool(documented == actual)


def test_the_documented_exchange_is_what_the_engine_worker_answers(
    scripted_model_dir: Path,
) -> None:
    exchange = documented_exchange()
    requests = [
        body.replace(PLACEHOLDER, str(scripted_model_dir)) for d, body in exchange if d == ">"
    ]
    expected = [json.loads(body) for d, body in exchange if d == "<"]
    assert len(requests) == len(expected) >= 10
    proc = subprocess.run(
        [sys.executable, "-m", "engine.core.scheduler_worker"],
        input="".join(f"{json.dumps(json.loads(r))}\n" for r in requests),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(answers) == len(expected)
    for request, documented, actual in zip(requests, expected, answers, strict=True):
        assert matches(documented, actual), f"{request}\n  doc: {documented}\n  got: {actual}"
