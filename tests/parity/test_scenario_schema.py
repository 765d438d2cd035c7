"""The committed JSON Schema is current, described, named by every bundled scenario, and
``parity schema`` prints it."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from parity_helpers import ROOT

from parity.cli import EXIT_OK, main
from parity.loader import collect_files, load_scenario
from parity.scenario import Scenario, json_schema

pytestmark = pytest.mark.timeout(30)

MODELINE = "# yaml-language-server: $schema="  # editors complete and check the file with it


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


def _properties(schema: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for name, definition in {"Scenario": schema, **schema["$defs"]}.items():
        for key, prop in definition.get("properties", {}).items():
            yield name, key, prop


def test_every_property_has_a_description() -> None:
    found = list(_properties(json_schema()))
    assert len(found) >= 99
    missing = [f"{name}.{key}" for name, key, prop in found if not prop.get("description")]
    assert missing == [], "add Field(description=...) in parity/scenario.py"


def test_every_bundled_scenario_names_the_schema_on_its_first_line() -> None:
    files = collect_files([ROOT / "scenarios"])
    assert len(files) >= 40
    schema = ROOT / "scenarios" / "schema.json"
    for file in files:
        first = file.read_text(encoding="utf-8").splitlines()[0]
        assert first == f"{MODELINE}{os.path.relpath(schema, file.parent)}", file
        load_scenario(file)  # the loader takes the line (a YAML comment)
