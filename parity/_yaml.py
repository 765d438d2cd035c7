"""Safe YAML loading that remembers where every key and list item came from.

``yaml.safe_load`` throws the node marks away. Here the document is composed first (keeping
each node's start mark), constructed with the safe constructor, and walked once to record the
1-based line of every mapping key and sequence item under its path, e.g.
``("requests", 0, "max_tokens") -> 12``. Duplicate keys, which plain PyYAML silently collapses,
are reported.
"""

from __future__ import annotations

from typing import Any

import yaml

from parity.errors import Problem, ScenarioError

Path = tuple[str | int, ...]
LineMap = dict[Path, int]


def load_with_lines(text: str, file: str) -> tuple[Any, LineMap]:
    """Parse one YAML document safely; return the data and the line of every path in it."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        message = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ScenarioError.at(file, line, f"invalid YAML: {message}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError.at(file, None, f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    lines: LineMap = {}
    if node is not None:
        lines[()] = node.start_mark.line + 1
        problems: list[Problem] = []
        _walk(node, (), lines, problems, file)
        if problems:
            raise ScenarioError(problems)
    return data, lines


def _walk(node: yaml.Node, path: Path, lines: LineMap, problems: list[Problem], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append(
                    Problem(file, line, f"duplicate key {key!r} (first at line {seen[key]})")
                )
                continue
            seen[key] = line
            lines[(*path, key)] = line
            _walk(value_node, (*path, key), lines, problems, file)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _walk(item, (*path, index), lines, problems, file)


def line_of(lines: LineMap, path: Path) -> int | None:
    """The line of the longest prefix of ``path`` that exists in the document.

    Mapping keys are recorded as strings and list items as ints; a non-string mapping key in
    ``path`` (``expect.steps`` is keyed by step number) is matched by its string form.
    """
    resolved: Path = ()
    best = lines.get(())
    for element in path:
        for candidate in (element, str(element)):
            line = lines.get((*resolved, candidate))
            if line is not None:
                resolved = (*resolved, candidate)
                best = line
                break
        else:
            break
    return best
