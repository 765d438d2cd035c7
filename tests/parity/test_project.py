"""The project file (parity.toml): discovery, paths relative to the file, target tables,
one-line errors with their line, ``parity init`` and ``parity suites``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from parity.catalog import expand_paths, suites_root
from parity.cli import EXIT_BAD_INPUT, EXIT_OK, main
from parity.errors import TargetSpecError
from parity.project import ProjectError, find_project, load_project
from parity.serve.spec import ServerConfig
from parity.serve.targets import (
    config_flags,
    parse_target,
    server_argv,
    server_cwd,
    server_env,
)

TFSERVE = """\
[parity]
scenarios = ["suite", "@serve"]
ledger = "decisions/ledger.yaml"
models = "models"

[targets.tfserve]
command = ["transformers", "serve", "{model}", "--host", "{host}", "--port", "{port}"]
health = "/health"
startup_timeout_s = 300
env = { HF_HUB_OFFLINE = "1" }
[targets.tfserve.flags]
block_size = ["--cb-block-size", "{value}"]
num_gpu_blocks_override = ["--cb-num-blocks", "{value}"]
dtype = ["--dtype", "{value}"]
max_model_len = false
enable_prefix_caching = { true = ["--prefix-cache"], false = ["--no-prefix-cache"] }
[targets.tfserve.capabilities]
return_token_ids = false
metrics = false
"""


def _write(folder: Path, text: str) -> Path:
    path = folder / "parity.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_found_from_a_subfolder_and_paths_relative_to_the_file(tmp_path: Path) -> None:
    _write(tmp_path, TFSERVE)
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    project = find_project(deep)
    assert project.root == tmp_path.resolve() and project.file == tmp_path.resolve() / "parity.toml"
    assert project.ledger == tmp_path.resolve() / "decisions" / "ledger.yaml"
    assert project.models == tmp_path.resolve() / "models"
    assert project.scenarios == (str(tmp_path.resolve() / "suite"), "@serve")
    assert project.model_dir("scripted") == tmp_path.resolve() / "models" / "scripted"
    assert {"engine", "oracle", "oracle@*", "oracle[unchecked]", "tfserve"} <= set(project.targets)


def test_no_project_file_is_the_working_folder(tmp_path: Path) -> None:
    project = find_project(tmp_path)
    assert project.file is None and project.root == tmp_path.resolve() and project.ledger is None
    assert project.models == tmp_path.resolve() / ".cache" / "models"


def test_a_named_target_spells_its_own_flags(tmp_path: Path) -> None:
    project = load_project(_write(tmp_path, TFSERVE))
    target = parse_target("tfserve", project)
    assert target.label == "tfserve"
    config = ServerConfig(
        model=str(tmp_path / "m"),
        engine_args={
            "block_size": 32,
            "num_gpu_blocks_override": 8,
            "enable_prefix_caching": False,
        },
    )
    flags, reason = config_flags(target, config)
    assert reason is None
    # the scenario's keys in its spelling; the harness's (float32, eager, sync, served name)
    # only where it has a spelling: dtype here, and no vLLM flag at all
    assert flags == ["--cb-block-size", "32", "--cb-num-blocks", "8", "--no-prefix-cache"] + [
        "--dtype",
        "float32",
    ]
    argv = server_argv(target, config, 4321)
    assert argv[:7] == ["transformers", "serve", str(tmp_path / "m"), "--host", "127.0.0.1"] + [
        "--port",
        "4321",
    ]
    assert server_env(target, {})["HF_HUB_OFFLINE"] == "1"
    assert server_cwd(target, config) == str(tmp_path)  # no cwd: the project folder


def test_a_cwd_takes_the_model_placeholders(tmp_path: Path) -> None:
    text = TFSERVE.replace('health = "/health"', 'health = "/health"\ncwd = "{model}/.."')
    target = parse_target("tfserve", load_project(_write(tmp_path, text)))
    config = ServerConfig(model=str(tmp_path / "models" / "m"))
    assert Path(server_cwd(target, config)).resolve() == tmp_path / "models"


def test_a_key_the_target_cannot_take_is_a_reason_not_a_flag(tmp_path: Path) -> None:
    project = load_project(_write(tmp_path, TFSERVE))
    target = parse_target("tfserve", project)
    _, reason = config_flags(target, ServerConfig(model="/m", engine_args={"max_model_len": 96}))
    assert reason is not None and "max_model_len" in reason and "false" in reason
    _, reason = config_flags(target, ServerConfig(model="/m", engine_args={"seed": 3}))
    assert reason is not None and "seed" in reason and "vLLM's flags" in reason
    _, reason = config_flags(target, ServerConfig(model="/m", extra_args=("--x",)))
    assert reason is not None and "extra_args" in reason


def test_vllm_flag_targets_spell_every_key_the_vllm_way() -> None:
    flags, reason = config_flags(
        parse_target("oracle"),
        ServerConfig(model="/m", engine_args={"max_model_len": 96, "seed": 3}),
    )
    assert reason is None and flags[:4] == ["--max-model-len", "96", "--dtype", "float32"]
    assert "--enforce-eager" in flags and "--no-async-scheduling" in flags


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("[parity]\nledgr = 'x'\n", 2, "parity.ledgr: unknown key"),
        ("[parity\n", 1, "invalid TOML"),
        ("[targets.x]\ncommand = ['srv']\n", 2, "must contain {port}"),
        ("[targets.x]\ncommand = ['srv', '{port}', '{modle}']\n", 2, "unknown placeholder {modle}"),
        (
            "[targets.x]\ncommand = ['s', '{port}']\n[targets.x.flags]\nblocksize = ['a']\n",
            4,
            "not a scenario config key",
        ),
        (
            "[targets.x]\ncommand = ['s', '{port}']\n[targets.x.capabilities]\nmetrics = 1\n",
            4,
            'true, false or "auto"',
        ),
        ("[targets.engine]\ncommand = ['s', '{port}']\n", 1, "a built-in target's name"),
        ("[targets.x]\ntier = 'scheduler'\n", 1, "needs a command"),
        ("[targets.x]\ncommand = 'srv {port}'\n", 2, "a non-empty list of strings"),
    ],
)
def test_bad_project_files_are_one_line_errors_with_a_line(
    tmp_path: Path, text: str, line: int, message: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ProjectError) as info:
        load_project(path)
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"{path.resolve()}:{line}: "), first
    assert message in first


def test_unknown_targets_list_the_known_ones(tmp_path: Path) -> None:
    project = load_project(_write(tmp_path, TFSERVE))
    with pytest.raises(TargetSpecError) as info:
        parse_target("tfserv", project)
    assert "tfserve" in str(info.value) and "oracle@VERSION" in str(info.value)


def test_a_named_ledger_that_does_not_exist_is_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = suites_root() / "scheduler" / "s09-self-preemption-recovery.yaml"
    missing = tmp_path / "nope.yaml"
    assert main(["run", str(scenario), "--ledger", str(missing), "--no-progress"]) == EXIT_BAD_INPUT
    assert "no such ledger file" in capsys.readouterr().err
    _write(tmp_path, "[parity]\nledger = 'typo.yaml'\n")
    monkeypatch.chdir(tmp_path)
    assert main(["run", str(scenario), "--no-progress"]) == EXIT_BAD_INPUT
    assert "typo.yaml: no such ledger file" in capsys.readouterr().err


def test_init_writes_a_starter_that_loads_and_keeps_existing_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["init", str(tmp_path)]) == EXIT_OK
    for name in ("parity.toml", "ledger.yaml", "scenarios/example.yaml", "parity-ci.yml"):
        assert (tmp_path / name).is_file(), name
    schema = json.loads((tmp_path / "scenarios" / "schema.json").read_text())
    assert schema["title"] == "vllm-parity scenario"
    project = load_project(tmp_path / "parity.toml")
    assert "myport" in project.targets and project.ledger == (tmp_path / "ledger.yaml").resolve()
    (tmp_path / "ledger.yaml").write_text("entries: []  # mine\n")
    capsys.readouterr()
    assert main(["init", str(tmp_path)]) == EXIT_OK
    assert "kept  " in capsys.readouterr().out
    assert (tmp_path / "ledger.yaml").read_text() == "entries: []  # mine\n"
    # the example scenario is valid
    from parity.loader import load_scenario

    assert load_scenario(tmp_path / "scenarios" / "example.yaml").id == "example"


def test_suites_travel_with_the_package(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["suites"]) == EXIT_OK
    out = capsys.readouterr().out
    for name in ("@default", "@scheduler", "@serve", "@hangs"):
        assert name in out
    folders = expand_paths(["@default"])
    assert [f.name for f in folders] == ["scheduler", "serve"] and all(f.is_dir() for f in folders)


def test_run_at_default_works_from_any_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code = main(["run", "@scheduler", "-k", "s09", "--tier", "scheduler", "--no-progress"])
    assert code == EXIT_OK, capsys.readouterr()
    out = capsys.readouterr().out
    assert "s09-self-preemption-recovery" in out
    assert (tmp_path / "reports" / "last-run.json").is_file()
    assert (tmp_path / ".cache" / "models" / "scripted" / "config.json").is_file()  # on demand
    assert os.getcwd() == str(tmp_path)


def test_a_server_only_target_makes_scheduler_scenarios_unsupported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, TFSERVE)
    (tmp_path / "decisions").mkdir()
    (tmp_path / "decisions" / "ledger.yaml").write_text("entries: []\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    args = ["run", "@scheduler", "-k", "s09 or s10", "--no-progress", "--target", "engine"]
    code = main([*args, "--target", "oracle", "--target", "tfserve"])
    out = capsys.readouterr().out
    assert code == EXIT_OK, out
    reason = "target 'tfserve' has no scheduler tier (a server only)"
    assert f"UNSUPPORTED 2 scenario(s) s09-self-preemption-recovery, s10-fcfs-victim-newest: {reason} (engine vs tfserve)" in out  # fmt: skip
    report = json.loads((tmp_path / "reports" / "last-run.json").read_text(encoding="utf-8"))
    verdicts = {(*f["targets"], f["verdict"]) for f in report["ledger"]["findings"]}
    assert verdicts == {("engine", "oracle", "PASS"), ("engine", "tfserve", "UNSUPPORTED")}
    statuses = {r["scenario_id"]: r["status"] for r in report["results"]}
    assert statuses == {"s09-self-preemption-recovery": "pass", "s10-fcfs-victim-newest": "pass"}
    # with no other scheduler-tier target the scenario is not run at all: no target is even
    # made (an in-process oracle would import vllm for nothing)
    import parity.targets

    made: list[str] = []
    monkeypatch.setattr(parity.targets, "make_target", lambda spec, *a, **k: made.append(spec))
    assert main(["run", "@scheduler", "-k", "s09", "--no-progress", "--target", "oracle", "--target", "tfserve"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert f"UNSUPPORTED 1 scenario(s) s09-self-preemption-recovery: {reason} (oracle vs tfserve)" in out  # fmt: skip
    assert made == []


def test_a_gguf_target_cannot_run_a_model_with_no_gguf_export(tmp_path: Path) -> None:
    from parity.serve.targets import unsupported_reason

    text = "[targets.llama]\ncommand = ['srv', '--model', '{model_gguf}', '--port', '{port}']\n"
    target = parse_target("llama", load_project(_write(tmp_path, text)))
    random = ServerConfig(model=str(tmp_path / "models" / "random"))
    assert unsupported_reason(target, random) == (
        "model random: llama takes a GGUF file, and it has none"
    )
    assert unsupported_reason(target, ServerConfig(model=str(tmp_path / "models" / "scripted"))) is None  # fmt: skip
    assert not (tmp_path / "models").exists()  # deciding exports nothing


@pytest.mark.parametrize(
    ("command", "cwd", "said"),
    [
        ('["./no-such-server", "--port", "{port}"]', None, "cannot run './no-such-server'"),
        ('["sh", "-c", "sleep 60", "{port}"]', "no-such-folder", "cannot run 'sh' in"),
    ],
)
def test_a_command_that_cannot_run_is_a_refused_start_not_a_traceback(
    tmp_path: Path, command: str, cwd: str | None, said: str
) -> None:
    from parity.serve import ServerPool

    text = f"[targets.ghost]\ncommand = {command}\n" + (f'cwd = "{cwd}"\n' if cwd else "")
    target = parse_target("ghost", load_project(_write(tmp_path, text)))
    with ServerPool(tmp_path / "logs") as pool:
        handle = pool.get(target, ServerConfig(model=str(tmp_path / "m")), startup_timeout_s=10)
    assert handle.startup.outcome == "startup_refused" and handle.process is None
    assert said in (handle.startup.error or ""), handle.startup.error
    assert "No such file or directory" in (handle.startup.error or "")


def test_a_target_whose_command_cannot_run_is_exit_3_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, '[targets.ghost]\ncommand = ["./no-such-server", "--port", "{port}"]\nvllm_flags = true\n')  # fmt: skip
    monkeypatch.chdir(tmp_path)
    scenario = suites_root() / "serve" / "unknown-model-404.yaml"
    args = ["run", str(scenario), "--tier", "serve", "--no-progress"]
    assert main([*args, "--target", "engine", "--target", "ghost"]) == 3
    out = capsys.readouterr().out
    assert "ghost: startup_refused: cannot run './no-such-server' in" in out, out
