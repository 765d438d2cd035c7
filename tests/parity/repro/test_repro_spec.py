"""Repro files: every shipped one loads; bad ones fail as ``file:line: message`` (exit 2)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from repro_support import HANGS

from parity.errors import ScenarioError
from parity.repro.spec import glob_match, load_repro
from parity.serve.spec import from_scenario

pytestmark = pytest.mark.timeout(60)

GOOD = """\
id: tiny
description: one leg
targets: [engine]
legs:
  - name: wedge
    role: wedge
    config: {block_size: 32, num_gpu_blocks_override: 3, max_model_len: 96}
    requests:
      - {id: r1, prompt_token_ids: [389, 444, 400], max_tokens: 90}
    expect:
      "oracle[unchecked]": zero_byte_hang
      "engine*": {outcome: self_preemption_wedge, sigterm: exited}
"""


def test_every_shipped_repro_loads() -> None:
    files = sorted(HANGS.glob("*.repro.yaml"))
    ids = {load_repro(f).id for f in files}
    assert {"port-wedge-serve", "clamp-hypothesis", "reasoning-budget", "saturation"} <= ids
    assert {"mid-stream-stall", "port-wedge-scheduler"} <= ids
    serve = load_repro(HANGS / "port-wedge-serve.repro.yaml")
    assert [leg.role for leg in serve.legs] == ["control", "wedge"] and serve.legs[1].sends_sigterm


def test_leg_becomes_a_located_scenario(write_repro: Callable[[str, str], Path]) -> None:
    repro = load_repro(write_repro("tiny", GOOD))
    scenario = repro.leg_scenario(0)
    assert scenario.id == "tiny--wedge" and scenario.tier == "serve"
    config, requests, limits = from_scenario(scenario)
    assert config.engine_args == {
        "block_size": 32,
        "num_gpu_blocks_override": 3,
        "max_model_len": 96,
    }
    assert requests[0].max_tokens == 90 and limits.stall_s == 2.0
    assert scenario.request_location("r1").endswith("tiny.repro.yaml:9")
    assert scenario.location(("config",)).endswith(":7")


def test_expect_keys_are_globs_with_literal_brackets(
    write_repro: Callable[[str, str], Path],
) -> None:
    leg = load_repro(write_repro("tiny", GOOD)).legs[0]
    assert glob_match("oracle[unchecked]", "oracle[unchecked]")
    assert not glob_match("oracle[unchecked]", "oracleu")
    assert leg.expectation("oracle[unchecked]").outcome == "zero_byte_hang"
    assert leg.expectation("engine --divergence legacy-capacity").sigterm == "exited"
    assert leg.expectation("oracle") is None


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (GOOD.replace("role: wedge", "role: jam"), 6, "legs[0].role: Input should be"),
        (
            GOOD.replace("max_tokens: 90", "max_tokenz: 90"),
            9,
            "legs[0].requests[0].max_tokenz: unknown key",
        ),
        (GOOD.replace("zero_byte_hang", "zero_bytes"), 11, "unknown outcome 'zero_bytes'"),
        (
            GOOD.replace("    role: wedge\n", "    role: wedge\n    \xa0: 1\n"),
            7,
            "legs[0].'\\xa0': unknown key",
        ),
        (GOOD.replace("id: tiny", "id: other"), 1, "'other' must equal the file name 'tiny'"),
        (
            GOOD.replace("    role: wedge\n", "    role: wedge\n    role: control\n"),
            7,
            "duplicate key 'role'",
        ),
    ],
    ids=["role", "unknown-key", "outcome", "no-break-space-key", "id", "duplicate"],
)
def test_errors_are_file_line_messages(
    write_repro: Callable[[str, str], Path], text: str, line: int, message: str
) -> None:
    path = write_repro("tiny", text)
    with pytest.raises(ScenarioError) as caught:
        load_repro(path)
    first = str(caught.value).splitlines()[0]
    assert first.startswith(f"{path}:{line}: ") and message in first, first


def test_cli_bad_file_exits_2_without_traceback(
    write_repro: Callable[[str, str], Path], run_cli: Callable[..., tuple[int, str, str]]
) -> None:
    path = write_repro("tiny", GOOD.replace("max_tokens: 90", "max_tokens: -1"))
    code, out, err = run_cli(str(path))
    assert code == 2 and "Traceback" not in err
    assert err.startswith(f"{path}:9: legs[0].requests[0].max_tokens:"), err
    code, _, err = run_cli(str(write_repro("tiny", GOOD)), "--target", "nonsense")
    assert code == 2 and "unknown serve-tier target 'nonsense'" in err
    code, _, err = run_cli(str(write_repro("tiny", GOOD)), "--leg", "nope")
    assert code == 2 and "unknown leg 'nope' (legs: wedge)" in err
