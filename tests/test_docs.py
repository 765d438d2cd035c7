"""The repository carries the documents its code relies on (docs/README.md).

- every ``docs/NAME.md`` the repository mentions exists, and docs/README.md lists every page;
- nothing cites the background files kept outside the repository (by bare name or by their
  shared folder): what the code relies on is in ``docs/``;
- nothing cites our issue tracker ("issue N", a bare ``#N``): say what the behaviour is instead.
  Upstream PR numbers ("PR #47272") and other projects' trackers (``owner/repo#N``) are fine.

Upstream: none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
SKIP_DIRS = {".git", ".venv", ".cache", "reports", "__pycache__", "node_modules"}
SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".json", ".cfg", ".ini", ".sh", ".j2"}
NAMES = {"Makefile", "run"}
THIS = Path(__file__).resolve()

# Background files that live outside the repository. Two share a name with a page of docs/
# (scripted-model.md, style.md): outside docs/ they must be cited as ``docs/NAME.md``.
BACKGROUND = ("mission", "field", "oracle-cpu", "scripted-model", "upstream-vllm-spec", "style")
BARE_BACKGROUND = re.compile(r"(?<![\w/.-])(?:" + "|".join(map(re.escape, BACKGROUND)) + r")\.md\b")
SHARED_FOLDER = re.compile(r"shared/docs\b")
DOCS_PATH = re.compile(r"(?<![\w.-])docs/([\w.-]+\.md)\b")
INDEX_LINK = re.compile(r"\]\(([\w.-]+\.md)\)")
ISSUE_WORD = re.compile(r"\b[Ii]ssues?\s+#?\d+")
BARE_NUMBER = re.compile(r"(?:(?<=\s)|(?<=\()|^)#\d{3,}\b", re.MULTILINE)
PR_BEFORE = re.compile(r"\bPRs?\s*$")


def repo_files() -> Iterator[Path]:
    """The repository's text files that code, docs, scenarios and tests live in."""
    stack = [ROOT]
    while stack:
        folder = stack.pop()
        for path in sorted(folder.iterdir()):
            if path.is_dir():
                if path.name not in SKIP_DIRS and not path.is_symlink():
                    stack.append(path)
            elif path.suffix in SUFFIXES or path.name in NAMES:
                yield path


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def external_citations(text: str, in_docs: bool) -> list[tuple[int, str]]:
    """(line, match) of every citation of a background file outside the repository."""
    found = [(m.start(), m.group()) for m in SHARED_FOLDER.finditer(text)]
    if not in_docs:
        found += [(m.start(), m.group()) for m in BARE_BACKGROUND.finditer(text)]
    return [(line_of(text, at), what) for at, what in sorted(found)]


def issue_mentions(text: str) -> list[tuple[int, str]]:
    """(line, match) of every mention of our issue tracker: "issue N" or a bare ``#N``."""
    found = [(m.start(), m.group()) for m in ISSUE_WORD.finditer(text)]
    for m in BARE_NUMBER.finditer(text):
        if not PR_BEFORE.search(text[max(0, m.start() - 8) : m.start()]):
            found.append((m.start(), m.group()))
    return [(line_of(text, at), what) for at, what in sorted(found)]


def scanned() -> list[tuple[Path, str]]:
    return [(path, path.read_text(encoding="utf-8", errors="replace")) for path in repo_files()]


@pytest.fixture(scope="module")
def files() -> list[tuple[Path, str]]:
    found = scanned()
    assert any(path == THIS for path, _ in found)  # the walk sees tests/
    assert any(path.parent == DOCS for path, _ in found)
    return found


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_every_docs_path_mentioned_exists(files: list[tuple[Path, str]]) -> None:
    missing = [
        f"{rel(path)}:{line_of(text, m.start())}: {m.group()}"
        for path, text in files
        if path != THIS
        for m in DOCS_PATH.finditer(text)
        if not (DOCS / m.group(1)).is_file()
    ]
    assert missing == []


def test_index_lists_every_page() -> None:
    listed = set(INDEX_LINK.findall((DOCS / "README.md").read_text(encoding="utf-8")))
    pages = {p.name for p in DOCS.glob("*.md")} - {"README.md"}
    assert pages, "docs/ holds no pages"
    assert sorted(pages - listed) == []


def test_no_citation_of_documents_outside_the_repository(files: list[tuple[Path, str]]) -> None:
    bad = [
        f"{rel(path)}:{line}: {what}"
        for path, text in files
        if path != THIS
        for line, what in external_citations(text, in_docs=path.parent == DOCS)
    ]
    assert bad == []


def test_no_issue_numbers(files: list[tuple[Path, str]]) -> None:
    bad = [
        f"{rel(path)}:{line}: {what}"
        for path, text in files
        if path != THIS
        for line, what in issue_mentions(text)
    ]
    assert bad == []


@pytest.mark.parametrize(
    "text",
    [
        "see mission.md", "(field.md row 12)", "docs: oracle-cpu.md", "upstream-vllm-spec.md B6.1",
        "per style.md", "scripted-model.md's tables", "/work/shared/docs/x", "`style.md`",
    ],
)  # fmt: skip
def test_external_citations_are_caught(text: str) -> None:
    assert external_citations(text, in_docs=False) != []


@pytest.mark.parametrize(
    "text", ["docs/style.md", 'docs/scripted-model.md, "The script"', "my_field.md", "x.md"]
)
def test_repo_citations_pass(text: str) -> None:
    assert external_citations(text, in_docs=False) == []


@pytest.mark.parametrize(
    "text",
    ["(issue 8)", "issue 9 item 6", "Issue #12", "issues 4", "(mission.md, #1737)", "#51030"],
)
def test_issue_mentions_are_caught(text: str) -> None:
    assert issue_mentions(text) != []


@pytest.mark.parametrize(
    "text",
    ["PR #47272", "vLLM PR\n#51030", "vllm#17972", 'fill="#555"', "color:#111827", "label ``#2``"],
)
def test_upstream_numbers_and_colours_pass(text: str) -> None:
    assert issue_mentions(text) == []


def test_docs_paths_are_found() -> None:
    assert [m.group(1) for m in DOCS_PATH.finditer("see docs/pins.md and ./docs/x-y.md.")] == [
        "pins.md",
        "x-y.md",
    ]
