"""Load scenario files with ``file:line`` errors; write scenarios back as YAML.

Errors come from three layers, all reported as ``file:line: message``: YAML syntax (the parser's
mark), the pydantic schema (each error's location mapped back to the line of the key or list
item through ``parity._yaml``), and the semantic checks below (``id`` equals the file stem,
request ids unique, exactly one prompt form, tier-specific keys, ``expect`` names known
requests). A text ``prompt`` of a scenario that runs at the scheduler tier is tokenized here
(``parity.prompts``) into its ``prompt_token_ids``; an unknown word or selector is a problem at
the prompt's line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path as FsPath
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from parity._yaml import LineMap, Path, dotted, line_of, load_with_lines
from parity.errors import Problem, ScenarioError, brief
from parity.prompts import PromptError, tokenizer_for
from parity.scenario import SCHEDULER_REQUEST_KEYS, ExpectSpec, Scenario

SERVE_CONFIG_KEYS = ("reasoning_parser", "extra_args")
SERVE_LIMIT_KEYS = (
    *("startup_timeout_s", "request_timeout_s", "stall_s"),
    *("latency_tolerance_ms", "logprob_tolerance", "preemptions_tolerance"),
)
NOT_SCENARIOS = frozenset({"ledger.yaml"})
_REQUEST_DEFAULTS = {"min_tokens": 0, "stop_token_ids": [], "priority": 0, "at_step": 0}
# ExpectSpec's dicts not keyed by request id (every other dict of it is: request id -> value)
_EXPECT_NOT_BY_REQUEST = frozenset({"steps", "startup_numbers"})
M = TypeVar("M", bound=BaseModel)


REPRO_SUFFIX = ".repro.yaml"  # parity repro files (parity/repro/spec.py), not scenarios


def collect_files(paths: Iterable[str | FsPath]) -> list[FsPath]:
    """Scenario files under ``paths``, sorted.

    A directory means every ``*.yaml`` below it except the decision ledger (``ledger.yaml``),
    hang-reproduction files (``*.repro.yaml``, run by ``parity repro``) and names starting with
    ``_`` (``is_scenario_name``); ``@suite`` names a bundled suite (``parity.catalog``); a file
    named explicitly is always taken.
    """
    from parity.catalog import expand_paths

    files: list[FsPath] = []
    for path in expand_paths(paths):
        if path.is_dir():
            found = (p for p in path.rglob("*.yaml") if p.is_file() and is_scenario_name(p))
            files.extend(sorted(found))
        elif path.is_file():
            files.append(path)
        else:
            raise ScenarioError.at(str(path), None, "no such file or directory")
    return files


def is_scenario_name(path: FsPath) -> bool:
    """The one collection rule (``parity run`` and ``pytest scenarios/`` alike): a ``*.yaml``
    that is not the ledger, not a ``parity repro`` file and not named ``_*``."""
    return (
        path.suffix == ".yaml"
        and path.name not in NOT_SCENARIOS
        and not path.name.startswith("_")
        and not path.name.endswith(REPRO_SUFFIX)
    )


def load_scenarios(paths: Iterable[str | FsPath]) -> list[Scenario]:
    """Load every scenario under ``paths``; all problems of all files in one ``ScenarioError``."""
    scenarios: list[Scenario] = []
    problems: list[Problem] = []
    seen: dict[str, str] = {}
    for file in collect_files(paths):
        try:
            scenario = load_scenario(file)
        except ScenarioError as exc:
            problems.extend(exc.problems)
            continue
        if scenario.id in seen:
            problems.append(
                Problem(
                    str(file), scenario.line_of(("id",)), f"duplicate id (also {seen[scenario.id]})"
                )
            )
            continue
        seen[scenario.id] = str(file)
        scenarios.append(scenario)
    if problems:
        raise ScenarioError(problems)
    return scenarios


def load_scenario(path: str | FsPath) -> Scenario:
    """Load and validate one scenario file."""
    return parse_scenario(read_source(path), str(path), stem=FsPath(path).stem)


def parse_scenario(text: str, file: str, stem: str | None = None) -> Scenario:
    """Validate scenario text; ``stem`` (when given) must equal the ``id``."""
    scenario, lines = validate_text(Scenario, text, file, "scenario")
    scenario.attach_source(file, lines)
    problems = located(file, lines, _semantic(scenario, stem))
    scenario, tokenized = _tokenize_prompts(scenario)
    problems.extend(located(file, lines, tokenized))
    raise_problems(problems)
    scenario.attach_source(file, lines)
    return scenario


def read_source(path: str | FsPath) -> str:
    """The text of the file ``path``; ``ScenarioError`` (``file: cannot read: ...``) if it
    cannot be read."""
    try:
        return FsPath(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError.at(str(path), None, f"cannot read: {exc}") from None


def validate_text(model: type[M], text: str, file: str, what: str) -> tuple[M, LineMap]:
    """YAML ``text`` validated as ``model``, with the line of every data path.

    ``ScenarioError`` for a YAML syntax error, an empty file (``empty <what> file``) or
    schema problems (``schema_problems``, ``what`` naming the top level).
    """
    data, lines = load_with_lines(text, file)
    if data is None:
        raise ScenarioError.at(file, 1, f"empty {what} file")
    try:
        return model.model_validate(data), lines
    except ValidationError as exc:
        raise ScenarioError(schema_problems(exc, data, lines, file, root=what)) from None


def located(file: str, lines: LineMap, found: Iterable[tuple[Path, str]]) -> list[Problem]:
    """Semantic problems (``(data path, message)``) as ``file:line: path: message``."""
    return [Problem(file, line_of(lines, path), f"{dotted(path)}: {m}") for path, m in found]


def raise_problems(problems: Sequence[Problem]) -> None:
    """Raise ``ScenarioError`` with ``problems`` in line order, if there are any."""
    if problems:
        raise ScenarioError(sorted(problems, key=lambda p: p.line or 0))


def _tokenize_prompts(scenario: Scenario) -> tuple[Scenario, list[tuple[Path, str]]]:
    """At the scheduler tier, a text ``prompt`` gets its ``prompt_token_ids`` (``parity.prompts``;
    the serve tier still sends the text). Unknown words and selectors are problems."""
    texts = [bool(r.prompt) and r.prompt_token_ids is None for r in scenario.requests]
    if not scenario.runs_at_scheduler_tier or not any(texts):
        return scenario, []
    found: list[tuple[Path, str]] = []
    try:
        tokenizer = tokenizer_for(scenario.config.model)
    except PromptError as exc:
        return scenario, [(("config", "model"), str(exc))]
    requests = []
    for index, request in enumerate(scenario.requests):
        if texts[index]:
            try:
                ids = tokenizer.encode(request.prompt or "")
            except PromptError as exc:
                found.append((("requests", index, "prompt"), str(exc)))
            else:
                request = request.model_copy(update={"prompt_token_ids": ids})
        requests.append(request)
    return scenario.model_copy(update={"requests": requests}), found


def schema_problems(
    exc: ValidationError, data: Any, lines: LineMap, file: str, root: str = "scenario"
) -> list[Problem]:
    """One ``file:line`` problem per data path; union branches at one path merge into one line.

    ``root`` names the document in a problem about the top level (``scenario``, ``repro``).
    """
    merged: dict[Path, list[str]] = {}
    inputs: dict[Path, Any] = {}
    for error in exc.errors():
        path = _data_path(data, error["loc"], error["type"] == "missing")
        messages = merged.setdefault(path, [])
        message = _message(error)
        if message not in messages:
            messages.append(message)
        inputs.setdefault(path, error.get("input"))
    problems = []
    for path, messages in merged.items():
        text = "; or ".join(messages)
        if len(messages) > 1 or "got" not in text and _shows_input(messages[0]):
            text += f", got {brief(inputs[path])}"
        where = dotted(path) or root
        problems.append(Problem(file, line_of(lines, path), f"{where}: {text}"))
    problems.sort(key=lambda p: (p.line or 0, p.message))
    return problems


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "missing required key"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _shows_input(message: str) -> bool:
    return message.startswith("Input should") or message.startswith("String should")


def _data_path(data: Any, loc: Sequence[Any], missing: bool) -> Path:
    """Keep the elements of a pydantic location that index the data (drop union tags)."""
    path: list[str | int] = []
    node = data
    for index, element in enumerate(loc):
        if isinstance(node, dict) and element in node:
            path.append(element)
            node = node[element]
        elif isinstance(node, list) and isinstance(element, int) and 0 <= element < len(node):
            path.append(element)
            node = node[element]
        elif missing and index == len(loc) - 1 and isinstance(element, str):
            path.append(element)
    return tuple(path)


def _semantic(scenario: Scenario, stem: str | None) -> list[tuple[Path, str]]:
    """Checks the schema cannot express, each with the path of the offending key."""
    found: list[tuple[Path, str]] = []
    if stem is not None and scenario.id != stem:
        found.append((("id",), f"{brief(scenario.id)} must equal the file name {brief(stem)}"))
    ids: dict[str, int] = {}
    for index, request in enumerate(scenario.requests):
        where: Path = ("requests", index)
        if request.id in ids:
            found.append(((*where, "id"), f"duplicate request id {brief(request.id)}"))
        ids.setdefault(request.id, index)
        forms = [k for k in ("prompt_token_ids", "prompt", "messages") if getattr(request, k)]
        if len(forms) != 1:
            found.append((where, "give exactly one of prompt_token_ids, prompt, messages"))
        found.extend(_tier_request_checks(scenario, request, where))
    if scenario.runs_at_scheduler_tier and scenario.config.num_gpu_blocks_override is None:
        found.append((("config",), "the scheduler tier needs num_gpu_blocks_override"))
    if scenario.tier == "scheduler":
        for key in SERVE_CONFIG_KEYS:
            if key in scenario.config.model_fields_set:
                found.append(
                    (("config", key), "a serve-tier key (this scenario is tier: scheduler)")
                )
        for key in SERVE_LIMIT_KEYS:
            if key in scenario.limits.model_fields_set:
                found.append(
                    (("limits", key), "a serve-tier key (this scenario is tier: scheduler)")
                )
    found.extend(_expect_checks(scenario, set(ids)))
    return found


def _tier_request_checks(scenario: Scenario, request: Any, where: Path) -> list[tuple[Path, str]]:
    found: list[tuple[Path, str]] = []
    if scenario.tier == "scheduler":
        for key in sorted(request.model_fields_set - SCHEDULER_REQUEST_KEYS):
            found.append(((*where, key), "a serve-tier key (this scenario is tier: scheduler)"))
    if scenario.tier == "serve" and "at_step" in request.model_fields_set:
        found.append(((*where, "at_step"), "a scheduler-tier key (the serve tier uses at_ms)"))
    if scenario.runs_at_scheduler_tier:
        if request.messages is not None:
            found.append((where, "the scheduler tier needs prompt_token_ids or a text prompt"))
        if request.max_tokens is None or request.max_tokens < 1:
            found.append(((*where, "max_tokens"), "required (>= 1) at the scheduler tier"))
    return found


def _expect_checks(scenario: Scenario, ids: set[str]) -> list[tuple[Path, str]]:
    expect = scenario.expect
    if expect is None:
        return []
    found: list[tuple[Path, str]] = []
    for key in ExpectSpec.model_fields:
        by_request = getattr(expect, key)
        if not isinstance(by_request, dict) or key in _EXPECT_NOT_BY_REQUEST:
            continue
        for request_id in by_request:
            if request_id not in ids:
                found.append((("expect", key, request_id), f"unknown request {brief(request_id)}"))
    for step in expect.steps:
        if step > scenario.limits.max_steps:
            found.append((("expect", "steps", step), f"step {step} is beyond limits.max_steps"))
    return found


def dump_scenario(scenario: Scenario) -> str:
    """YAML text of ``scenario`` (keys set explicitly only) that loads back to an equal one."""
    data = scenario.model_dump(mode="json", exclude_unset=True)
    for request in data["requests"]:  # drop per-request keys left at their defaults
        if "prompt" in request and "prompt_token_ids" in request:  # tokenized by the loader
            del request[_stale_prompt_form(scenario, request)]
        for key, default in _REQUEST_DEFAULTS.items():
            if key in request and request[key] == default:
                del request[key]
    if scenario.expect is not None and "steps" in data.get("expect", {}):
        data["expect"]["steps"] = {int(k): v for k, v in data["expect"]["steps"].items()}
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)


def _stale_prompt_form(scenario: Scenario, request: dict[str, Any]) -> str:
    """Of a text prompt and the ids the loader gave it, the one to drop: the ids while they
    are the text's; the text once the ids were changed (a shrunk prompt)."""
    try:
        ids = tokenizer_for(scenario.config.model).encode(request["prompt"])
    except PromptError:
        return "prompt"
    return "prompt_token_ids" if ids == request["prompt_token_ids"] else "prompt"


def write_scenario(scenario: Scenario, directory: str | FsPath) -> FsPath:
    """Write ``scenario`` to ``directory/<id>.yaml`` and return the path."""
    folder = FsPath(directory)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{scenario.id}.yaml"
    path.write_text(dump_scenario(scenario), encoding="utf-8")
    return path
