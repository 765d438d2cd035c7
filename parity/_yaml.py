"""Safe YAML loading that remembers where every key and list item came from.

``yaml.safe_load`` throws the node marks away. Here the document is composed first (keeping
each node's start mark), constructed with the safe constructor, and walked once to record the
1-based line of every mapping key and sequence item under its path, e.g.
``("requests", 0, "max_tokens") -> 12``. Duplicate keys, which plain PyYAML silently collapses,
are reported.

Hostile files are refused with one ``file:line: message`` line before they can cost time or
memory: more than ``MAX_CHARS`` characters, nesting deeper than ``MAX_DEPTH`` (counted as the
data would be, aliases expanded), more than ``MAX_ALIASES`` aliases, more than ``MAX_NODES``
nodes once aliases are expanded (the "billion laughs" bomb), a recursive alias, or a scalar
the safe constructor cannot convert (``!!int abc``, a 5,000-digit integer, ``2001-13-45``).
Only the safe constructor is used: ``!!python/...`` tags are errors.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError

from parity.errors import Problem, ScenarioError, brief, shown

Path = tuple[str | int, ...]
LineMap = dict[Path, int]

MAX_CHARS = 1 << 20  # 1 MiB of text: the largest scenario is ~2 KiB
MAX_DEPTH = 40  # nesting levels (a scenario needs ~7)
MAX_ALIASES = 200  # ``*name`` references in one document
MAX_NODES = 20_000  # scalars + collections, aliases expanded (PyYAML: ~0.06 s per 1,000)


class _LimitError(yaml.MarkedYAMLError):
    """A document over one of the limits (a ``MarkedYAMLError``, so it renders like one)."""


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that bounds composition depth and aliases, and marks conversion errors."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.depth = 0
        self.aliases = 0
        self.nodes = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _LimitError(problem=f"more than {MAX_ALIASES} aliases", problem_mark=mark)
        else:
            self.nodes += 1
            if self.nodes > MAX_NODES:
                raise _LimitError(problem=f"more than {MAX_NODES} nodes", problem_mark=mark)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _LimitError(
                    problem=f"nested deeper than {MAX_DEPTH} levels", problem_mark=mark
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, ArithmeticError) as exc:  # e.g. !!int abc, 2001-13-45
            raise ConstructorError(
                problem=f"cannot convert {node.tag.rsplit(':', 1)[-1]} value: {exc}",
                problem_mark=node.start_mark,
            ) from None


def load_with_lines(text: str, file: str) -> tuple[Any, LineMap]:
    """Parse one YAML document safely; return the data and the line of every path in it."""
    if len(text) > MAX_CHARS:
        raise ScenarioError.at(file, None, f"file too large ({len(text)} > {MAX_CHARS} characters)")
    try:
        loader = _BoundedLoader(text)  # the reader refuses control characters here already
    except yaml.reader.ReaderError as exc:
        line: int | None = text.count("\n", 0, exc.position) + 1
        raise ScenarioError.at(
            file, line, f"invalid YAML: {exc.reason} (#x{exc.character:04x})"
        ) from None
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_expanded(node)
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        message = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ScenarioError.at(file, line, f"invalid YAML: {message}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        message = f"invalid YAML: {exc.reason} (#x{exc.character:04x})"
        raise ScenarioError.at(file, line, message) from None
    except yaml.YAMLError as exc:
        raise ScenarioError.at(file, None, f"invalid YAML: {exc}") from None
    except RecursionError:  # a backstop: the limits above should make this unreachable
        raise ScenarioError.at(file, None, "invalid YAML: nested too deeply") from None
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


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_expanded(root: yaml.Node) -> None:
    """Refuse a node graph whose alias-expanded tree is too large or deep, or is cyclic.

    Iterative post-order walk over the distinct nodes (aliases share nodes), with the expanded
    size and depth of each node memoised: linear in the document, whatever it expands to."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            open_nodes.discard(key)
            if size[key] > MAX_NODES:
                raise _LimitError(
                    problem=f"more than {MAX_NODES} nodes once aliases are expanded",
                    problem_mark=node.start_mark,
                )
            if depth[key] > MAX_DEPTH:
                raise _LimitError(
                    problem=f"nested deeper than {MAX_DEPTH} levels once aliases are expanded",
                    problem_mark=node.start_mark,
                )
            continue
        if key in size:
            continue
        open_nodes.add(key)
        stack.append((node, True))
        for kid in _children(node):
            if id(kid) in open_nodes:
                raise _LimitError(problem="recursive alias", problem_mark=kid.start_mark)
            if id(kid) not in size:
                stack.append((kid, False))


def _walk(node: yaml.Node, path: Path, lines: LineMap, problems: list[Problem], file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
            line = key_node.start_mark.line + 1
            if key in seen:
                problems.append(
                    Problem(file, line, f"duplicate key {brief(key)} (first at line {seen[key]})")
                )
                continue
            seen[key] = line
            lines[(*path, key)] = line
            _walk(value_node, (*path, key), lines, problems, file)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            lines[(*path, index)] = item.start_mark.line + 1
            _walk(item, (*path, index), lines, problems, file)


def dotted(path: Path) -> str:
    """``("requests", 0, "max_tokens")`` -> ``requests[0].max_tokens``; a key that would not
    show (``"\\xa0"``, ``""``, a control character) is quoted with escapes (``errors.shown``)."""
    text = ""
    for element in path:
        if isinstance(element, int):
            text += f"[{element}]"
        else:
            key = shown(str(element))
            text += f".{key}" if text else key
    return text


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
