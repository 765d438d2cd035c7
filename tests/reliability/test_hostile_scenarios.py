"""Hostile scenario files: rejected with ``file:line: message``, exit 2, fast,
in bounded memory, loaded safely, and never a way to run a command.

Three layers: named hostile documents (alias bombs, deep nesting, invalid UTF-8, huge numbers,
python tags, ...) through ``parity.loader.load_scenario`` under ``tracemalloc`` and a clock;
hypothesis-generated documents (a valid scenario mutated with junk values and unknown keys, and
raw YAML-ish or binary junk) through the same loader; and ``parity run FILE`` as a subprocess on
a few of them (exit 2, no traceback, one ``file[:line]: message`` per line). The limits are in
``parity._yaml`` (``MAX_CHARS``, ``MAX_DEPTH``, ``MAX_ALIASES``, ``MAX_NODES``).

Command execution: the schema has no ``targets:`` key (``extra="forbid"``), so a file cannot
name an ``external:`` command; the remaining vector, ``config.extra_args`` (server flags such as
vLLM's ``--tool-parser-plugin FILE``), is refused by ``parity.serve.spec.from_scenario`` unless
the caller allows it, and strings of a file never reach a shell.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import signal
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from reliability_support import SCALE

from parity import _yaml
from parity.errors import ScenarioError
from parity.loader import load_scenario
from parity.scenario import Scenario
from parity.serve.spec import from_scenario
from parity.serve.targets import parse_target, server_argv

ROOT = Path(__file__).resolve().parents[2]
LOAD_BOUND_S = 2.0  # CPU seconds of slack above the reference parse (see ``_load_budget_s``)
PEAK_BOUND_BYTES = 64 * 1024 * 1024
CLI_BOUND_S = 30.0  # interpreter start and imports on a shared 2-core machine, not the parse

VALID = {
    "id": "hostile",
    "description": "a valid serve scenario the generators mutate",
    "tier": "serve",
    "config": {"block_size": 32, "max_model_len": 128},
    "requests": [
        {"id": "r1", "endpoint": "completions", "prompt_token_ids": [389, 65], "max_tokens": 4},
        {"id": "r2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    ],
    "limits": {"stall_s": 5},
    "expect": {"status": {"r1": 200}},
}


def _bomb(levels: int, width: int = 9) -> str:
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    for level in range(1, levels):
        refs = ", ".join([f"*a{level - 1}"] * width)
        lines.append(f"a{level}: &a{level} [{refs}]")
    return "\n".join(lines) + "\n"


def _deep_block(depth: int) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(depth)) + "  " * depth + "leaf\n"


HEADER = "id: {stem}\ndescription: x\ntier: serve\n"

# name -> (file bytes, a fragment the message must contain)
CASES: dict[str, tuple[bytes, str]] = {
    "billion-laughs": (_bomb(9).encode(), "nodes once aliases are expanded"),
    "too-many-aliases": (
        ("a: &a x\nb: [" + ", ".join(["*a"] * (_yaml.MAX_ALIASES + 5)) + "]\n").encode(),
        "aliases",
    ),
    "recursive-alias": (b"a: &a [1, *a]\n", "recursive alias"),
    "recursive-mapping": (b"a: &a {b: *a}\n", "recursive alias"),
    "deep-flow": (b"requests: " + b"[" * 5000 + b"]" * 5000 + b"\n", "nested deeper"),
    "deep-block": (_deep_block(300).encode(), "nested deeper"),
    "deep-by-alias": (
        (
            "a: &a " + "[" * 30 + "1" + "]" * 30 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n"
        ).encode(),
        "once aliases are expanded",
    ),
    "invalid-utf8": (b"id: \xff\xfe\xfd\ndescription: x\n", "cannot read"),
    "binary-junk": (bytes(range(256)) * 8, "cannot read"),
    "nul-bytes": (b"id: a\x00b\ndescription: x\n", "invalid YAML"),
    "huge-int": (b"max: 1" + b"9" * 6000 + b"\n", "cannot convert int"),
    "bad-timestamp": (b"when: 2001-13-45\n", "cannot convert timestamp"),
    "tagged-int": (b"n: !!int abc\n", "cannot convert int"),
    "python-tag": (b"x: !!python/object/apply:os.system ['true']\n", "python/object"),
    "python-name": (b"x: !!python/name:os.system\n", "python/name"),
    "tabs": (b"id: x\nconfig:\n\tblock_size: 16\n", "invalid YAML"),
    "duplicate-keys": (b"id: a\ndescription: x\nid: b\n", "duplicate key 'id'"),
    "top-level-list": (b"- id: x\n- id: y\n", "scenario"),
    "top-level-scalar": (b"just a string\n", "scenario"),
    "empty": (b"", "empty scenario file"),
    "only-comment": (b"# nothing\n", "empty scenario file"),
    "two-documents": (b"id: a\n---\nid: b\n", "invalid YAML"),
    "too-large": (b"description: " + b"x" * (_yaml.MAX_CHARS + 10) + b"\n", "file too large"),
    "long-flow-list": (b"x: [" + b"a, " * 300_000 + b"]\n", "more than 20000 nodes"),
    "long-line-junk": (b"id: [" + b"{:" * 200_000 + b"\n", "invalid YAML"),
    "unhashable-key": (b"? [a, b]\n: 1\n", "unhashable"),
    "unknown-key": (HEADER.encode() + b"requests: [{id: r, prompt: x}]\nbogus: 1\n", "unknown key"),
    "targets-key": (
        HEADER.encode() + b"requests: [{id: r, prompt: x}]\ntargets: ['external:touch {port}']\n",
        "targets: unknown key",
    ),
    "bad-types": (
        HEADER.encode() + b"requests: [{id: r, prompt: 5, max_tokens: '7', stream: yes-ish}]\n",
        "requests[0]",
    ),
    "huge-numbers": (
        HEADER.encode()
        + b"config: {block_size: 1e400, max_model_len: -.inf}\nrequests: [{id: r}]\n",
        "config.block_size",
    ),
    "nan-limits": (
        HEADER.encode() + b"requests: [{id: r, prompt: x}]\nlimits: {stall_s: .nan}\n",
        "limits.stall_s",
    ),
}
CLI_CASES = ("billion-laughs", "deep-flow", "invalid-utf8", "python-tag", "huge-int", "targets-key")
_PROBLEM = re.compile(r"^(?P<file>.+?)(?::(?P<line>\d+))?: (?P<message>\S.*)$")


def _assert_problems(text: str, file: Path, num_lines: int) -> list[str]:
    """Every line of ``text`` is ``file[:line]: message`` with ``line`` inside the file, and
    shows every character it names (no raw tab, no-break space, zero-width or control one)."""
    messages = []
    lines = text.strip("\n").split("\n")
    assert lines, "no problem reported"
    for line in lines:
        assert len(line) < 2000, f"a problem line of {len(line)} characters"
        assert line.isprintable(), f"a character that does not show: {line!r}"
        match = _PROBLEM.match(line)
        assert match and match["file"] == str(file), f"not 'file[:line]: message': {line!r}"
        if match["line"] is not None:
            assert 1 <= int(match["line"]) <= num_lines + 1, line
        messages.append(match["message"])
    return messages


def _load(path: Path) -> Scenario | ScenarioError:
    try:
        return load_scenario(path)
    except ScenarioError as exc:
        return exc


@functools.cache
def _reference_parse_s() -> float:
    """CPU seconds this process takes to parse a list of ``MAX_NODES`` scalars: the most any file
    under the node limit costs, measured in the same run (and so under the same load)."""
    text = "x: [" + "a, " * (_yaml.MAX_NODES - 3) + "]\n"
    began = time.process_time()
    _yaml.load_with_lines(text, "reference.yaml")
    return time.process_time() - began


def _load_budget_s() -> float:
    """A hostile file may cost at most what the node limit allows (twice the reference parse)
    plus ``LOAD_BOUND_S``: linear work stops at the limit, so only an expansion the limit missed
    (seconds to minutes) goes over. CPU time, not wall time: a busy machine does not count."""
    return LOAD_BOUND_S + 2 * _reference_parse_s()


def _load_bounded(path: Path) -> tuple[Scenario | ScenarioError, float, int]:
    """Load ``path``; return (scenario or error, CPU seconds, traced peak bytes). Timed without
    ``tracemalloc`` (which slows allocation-heavy parsing several times), then measured with it."""
    began = time.process_time()
    outcome = _load(path)
    elapsed = time.process_time() - began
    tracemalloc.start()
    try:
        again = _load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert type(again) is type(outcome) and str(again) == str(outcome)
    return outcome, elapsed, peak


def _num_lines(data: bytes) -> int:
    """Lines as YAML counts them (NEL, LS and PS break lines too): an upper bound."""
    return len(data.decode("utf-8", "replace").splitlines()) + 1


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_file_is_rejected_in_bounded_time_and_memory(tmp_path: Path, name: str) -> None:
    data, fragment = CASES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data.replace(b"{stem}", name.encode()))
    outcome, elapsed, peak = _load_bounded(path)
    assert isinstance(outcome, ScenarioError), f"{name} loaded: {outcome!r}"[:500]
    messages = _assert_problems(str(outcome), path, _num_lines(data))
    assert any(fragment in m for m in messages), messages
    assert elapsed < _load_budget_s(), f"{name}: {elapsed:.2f} s of CPU"
    assert peak < PEAK_BOUND_BYTES + 4 * len(data), f"{name}: peak {peak / 2**20:.1f} MiB"


@pytest.mark.timeout(30)
def test_bomb_just_under_the_node_limit_loads_fast_and_small(tmp_path: Path) -> None:
    """The limit is not a blanket ban on aliases: a modest expansion still parses quickly."""
    path = tmp_path / "small-bomb.yaml"
    path.write_text(HEADER.format(stem="small-bomb") + "x:\n  " + _bomb(4).replace("\n", "\n  "))
    outcome, elapsed, peak = _load_bounded(path)
    assert isinstance(outcome, ScenarioError)  # x: and a0..a2 are unknown keys, nothing else
    assert all(
        "unknown key" in m or "missing" in m for m in _assert_problems(str(outcome), path, 9)
    )
    assert elapsed < _load_budget_s() and peak < PEAK_BOUND_BYTES


def _cli(path: Path, *extra: str, cwd: Path) -> tuple[int, str, float]:
    argv = [sys.executable, "-m", "parity.cli", "run", str(path), "--no-progress", *extra]
    began = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        process_group=0,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        _, err = proc.communicate(timeout=CLI_BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        pytest.fail(f"parity run {path.name} did not exit within {CLI_BOUND_S} s")
    return proc.returncode, err.decode("utf-8", "replace"), time.perf_counter() - began


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", CLI_CASES)
def test_parity_run_exits_2_with_one_line_per_problem(tmp_path: Path, name: str) -> None:
    data, fragment = CASES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data.replace(b"{stem}", name.encode()))
    code, err, elapsed = _cli(path, cwd=tmp_path)
    assert code == 2, err
    assert "Traceback" not in err, err
    assert any(fragment in m for m in _assert_problems(err, path, _num_lines(data))), err
    print(f"parity run {name}: exit 2 in {elapsed:.2f} s")


# --- hypothesis ----------------------------------------------------------------------------

_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([10**300, -(10**300), 2**63, -1, 0]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.text(alphabet="\t\n\r :-[]{}&*!|>'\"%@`#,?", max_size=30),
    st.binary(max_size=20),
)
_junk = st.recursive(
    _scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_KEYS = ["id", "description", "tier", "config", "requests", "limits", "expect"]


@st.composite
def _mutated(draw: st.DrawFn) -> dict[str, Any]:
    """VALID with a few values replaced by junk, keys dropped, or unknown keys added."""
    data = copy.deepcopy(VALID)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        target: Any = data
        path = draw(
            st.sampled_from(
                [(k,) for k in _KEYS]
                + [("config", "block_size"), ("config", "extra_args"), ("config", "model")]
                + [("requests", 0, k) for k in ("id", "prompt_token_ids", "max_tokens", "stop")]
                + [("requests", 1, "messages"), ("requests", 1, "messages", 0, "role")]
                + [("limits", "stall_s"), ("expect", "status"), ("bogus",), ("config", "bogus")]
            )
        )
        try:
            for element in path[:-1]:
                target = target[element]
        except (KeyError, IndexError, TypeError):
            continue
        action = draw(st.sampled_from(["replace", "delete"]))
        if not isinstance(target, dict | list):
            continue
        if action == "delete" and isinstance(target, dict):
            target.pop(path[-1], None)
        elif isinstance(target, dict) or (isinstance(path[-1], int) and path[-1] < len(target)):
            target[path[-1]] = draw(_junk)
    return data


def _check_generated(tmp_path: Path, data: bytes, name: str) -> None:
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(data)
    outcome, elapsed, peak = _load_bounded(path)
    assert elapsed < _load_budget_s(), f"{elapsed:.2f} s of CPU for {data[:200]!r}"
    assert peak < PEAK_BOUND_BYTES + 4 * len(data), f"peak {peak} for {data[:200]!r}"
    if isinstance(outcome, ScenarioError):
        _assert_problems(str(outcome), path, _num_lines(data))


@pytest.mark.timeout(240 * SCALE)
@settings(
    max_examples=200 * SCALE,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=_mutated(), flow=st.booleans())
# found by the soak: a huge value was quoted whole, a problem line of over 2,000 characters
@example(data={**VALID, "id": [10**300] * 8}, flow=False)
def test_generated_scenarios_load_or_fail_cleanly(
    tmp_path: Path, data: dict[str, Any], flow: bool
) -> None:
    """A mutated scenario either loads or is one ``file[:line]: message`` per problem."""
    try:
        text = yaml.safe_dump(data, default_flow_style=flow, allow_unicode=True, sort_keys=False)
    except yaml.YAMLError:
        return  # not representable (cannot happen with the strategies above)
    _check_generated(
        tmp_path, text.replace("id: hostile", "id: generated", 1).encode(), "generated"
    )


_FRAGMENTS = st.sampled_from(
    [
        *("&a ", "*a ", "<<: *a", "!!python/object:os.system ", "!!binary ", "!!set ", "!!omap "),
        *("? ", ": ", "- ", "[", "]", "{", "}", ",", "\t", "\n", "  ", "'", '"', "|", ">"),
        *("%YAML 1.1\n", "---\n", "...\n", "id: x\n", "tier: serve\n", "requests:\n"),
        *("1e999", "0x", "0o7", ".inf", ".nan", "2001-13-45", "~", "\\", "\u2028", "\ufeff"),
    ]
)


@pytest.mark.timeout(240 * SCALE)
@settings(
    max_examples=200 * SCALE,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    raw=st.one_of(
        st.lists(st.one_of(_FRAGMENTS, st.text(max_size=6)), max_size=60).map(
            lambda parts: "".join(parts).encode("utf-8", "surrogatepass")
        ),
        st.binary(max_size=300),
    )
)
@example(raw=b"\xc2\xa0:")  # found by the soak: a no-break-space key was printed raw
def test_generated_junk_is_rejected_cleanly(tmp_path: Path, raw: bytes) -> None:
    """YAML-ish or binary junk never escapes as anything but a ``ScenarioError``."""
    _check_generated(tmp_path, raw, "junk")


# --- no command execution from a file ------------------------------------------------------


def _serve_scenario(tmp_path: Path, stem: str, config: str, marker: Path) -> Path:
    text = (
        f"id: {stem}\ndescription: '$(touch {marker})'\ntier: serve\n{config}"
        f"requests:\n  - id: r1\n    prompt: '; touch {marker}; `touch {marker}`'\n"
        "    max_tokens: 2\n"
    )
    path = tmp_path / f"{stem}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "flags",
    [
        ["--tool-parser-plugin", "{plugin}"],
        ["--reasoning-parser-plugin={plugin}"],
        ["--trust-remote-code"],
        ["--max-num-seqs", "4", "--middleware", "evil.Middleware"],
        ["--chat-template", "/etc/passwd"],
        ["--host", "0.0.0.0"],
    ],
)
def test_extra_args_that_load_code_are_refused(tmp_path: Path, flags: list[str]) -> None:
    plugin = tmp_path / "plugin.py"
    words = ", ".join(repr(f.replace("{plugin}", str(plugin))) for f in flags)
    path = _serve_scenario(tmp_path, "evil", f"config:\n  extra_args: [{words}]\n", tmp_path / "m")
    scenario = load_scenario(path)  # the schema accepts any strings: the check is at use
    with pytest.raises(ScenarioError) as caught:
        from_scenario(scenario)
    assert str(caught.value).startswith(f"{path}:5: config.extra_args: "), str(caught.value)
    config = from_scenario(scenario, allow_any_flags=True)[0]  # an explicit opt-in still works
    assert config.extra_args == tuple(f.replace("{plugin}", str(plugin)) for f in flags)


@pytest.mark.timeout(30)
def test_allowed_extra_args_pass() -> None:
    text = HEADER.format(stem="ok") + (
        "config:\n  extra_args: [--max-num-seqs, '4', --seed, '-1', --enable-prompt-tokens-details]\n"
        "requests: [{id: r, prompt: x}]\n"
    )
    from parity.loader import parse_scenario

    config = from_scenario(parse_scenario(text, "ok.yaml", stem="ok"))[0]
    assert "--enable-prompt-tokens-details" in config.extra_args


@pytest.mark.timeout(30)
def test_scenario_strings_never_reach_a_shell(tmp_path: Path) -> None:
    """Every target's argv is a list of words (no shell); shell syntax in a file stays data."""
    marker = tmp_path / "marker"
    path = _serve_scenario(tmp_path, "shelly", f"config:\n  model: '$(touch {marker})'\n", marker)
    config = from_scenario(load_scenario(path))[0]
    for spec in ("engine", "oracle"):
        argv = server_argv(parse_target(spec), config, 1234)
        # one literal word (the model folder, made absolute), never interpreted
        assert any(word.endswith(f"$(touch {marker})") for word in argv), argv
    assert not Path(sys.executable).name.endswith("sh")


@pytest.mark.timeout(120)
def test_parity_run_on_a_plugin_scenario_starts_nothing(tmp_path: Path) -> None:
    """End to end: exit 2 before any server starts, and the plugin file never runs."""
    marker = tmp_path / "ran"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(f"open({str(marker)!r}, 'w').write('ran')\n", encoding="utf-8")
    config = f"config:\n  extra_args: [--tool-parser-plugin, '{plugin}']\n"
    path = _serve_scenario(tmp_path, "plugin", config, marker)
    code, err, _ = _cli(path, "--tier", "serve", "--target", "engine", cwd=tmp_path)
    assert code == 2 and "Traceback" not in err, err
    assert _assert_problems(err, path, 9)[0].startswith("config.extra_args: '--tool-parser-plugin'")
    assert not marker.exists()
    assert not (tmp_path / "reports").exists()  # nothing ran, nothing was written


@pytest.mark.timeout(120)
def test_python_tag_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    text = HEADER.format(stem="tagged") + (
        f"requests: !!python/object/apply:os.system ['touch {marker}']\n"
    )
    path = tmp_path / "tagged.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ScenarioError, match=r"tagged.yaml:4: invalid YAML: .*python/object"):
        load_scenario(path)
    code, err, _ = _cli(path, cwd=tmp_path)
    assert code == 2 and "Traceback" not in err, err
    assert not marker.exists()


# --- repro files (``parity repro``) may name targets: external commands need an opt-in -----

REPRO = """\
id: hostile-repro
description: a repro whose targets a user did not choose
targets: [{target!r}]
legs:
  - name: only
    role: control
    config: {{block_size: 32, max_model_len: 96}}
    requests:
      - {{id: r1, prompt_token_ids: [389, 65], max_tokens: 2}}
    limits: {{startup_timeout_s: 30.0, request_timeout_s: 10.0}}
"""


def _repro(tmp_path: Path, target: str, *extra: str) -> tuple[int, str, Path]:
    path = tmp_path / "hostile-repro.repro.yaml"
    path.write_text(REPRO.format(target=target), encoding="utf-8")
    argv = [sys.executable, "-m", "parity.repro", str(path), "--out", str(tmp_path / "out")]
    proc = subprocess.Popen(
        [*argv, *extra],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        process_group=0,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        out, err = proc.communicate(timeout=CLI_BOUND_S * 2)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        pytest.fail("parity repro did not exit in time")
    return proc.returncode, (out + err).decode("utf-8", "replace"), path


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "target",
    ["external:sh -c 'touch {marker}' {port}", "oracle --tool-parser-plugin={marker}.py"],
    ids=["external", "plugin-flag"],
)
def test_repro_file_commands_need_an_opt_in(tmp_path: Path, target: str) -> None:
    marker = tmp_path / "ran"
    code, output, path = _repro(tmp_path, target.replace("{marker}", str(marker)))
    assert code == 2 and "Traceback" not in output, output
    assert f"{path}:3: target " in output and "--allow-external-from-file" in output, output
    assert not marker.exists()


@pytest.mark.timeout(180)
def test_repro_external_command_runs_when_allowed(tmp_path: Path) -> None:
    """The opt-in works: the file's command runs (here it exits at once: startup refused)."""
    marker = tmp_path / "ran"
    target = f"external:sh -c 'touch {marker}; exit 7' {{port}}"
    code, output, _ = _repro(tmp_path, target, "--allow-external-from-file")
    assert "Traceback" not in output, output
    assert marker.exists(), output
    assert code == 3, output  # the target failed to start: exit 3, not a hang
