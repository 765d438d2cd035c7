"""The committed JSON Schema is current, and ``parity schema`` prints it."""

from __future__ import annotations

import json

import pytest
from parity_helpers import ROOT

from parity.cli import EXIT_OK, main
from parity.scenario import Scenario, json_schema

pytestmark = pytest.mark.timeout(30)


def test_committed_schema_is_current() -> None:
    committed = json.loads((ROOT / "scenarios" / "schema.json").read_text(encoding="utf-8"))
    assert committed == json_schema(), "regenerate: parity schema > scenarios/schema.json"


def test_parity_schema_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == EXIT_OK
    printed = json.loads(capsys.readouterr().out)
    assert printed == json_schema()
    assert printed["additionalProperties"] is False
    assert set(printed["required"]) == {"id", "description", "tier", "requests"}
    assert set(printed["properties"]) == set(Scenario.model_fields)
