"""``-k EXPR`` selection, as in pytest: substrings combined with ``and``, ``or``, ``not``, ().

``port and not control`` selects every scenario whose id (or folder name) contains ``port``
(case-insensitive) and none containing ``control``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

from parity.errors import ParityError

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")


class KeywordError(ParityError):
    """A malformed ``-k`` expression."""


def matches(expression: str, names: Iterable[str]) -> bool:
    """True when ``expression`` selects an item known by ``names``."""
    haystack = [name.lower() for name in names]
    tokens = _TOKEN.findall(expression)
    if not tokens:
        return True
    parser = _Parser(tokens, haystack, expression)
    result = parser.parse_or()
    if parser.pos != len(tokens):
        raise KeywordError(f"-k {expression!r}: unexpected {tokens[parser.pos]!r}")
    return result


class _Parser:
    def __init__(self, tokens: list[str], haystack: list[str], expression: str) -> None:
        self.tokens = tokens
        self.haystack = haystack
        self.expression = expression
        self.pos = 0

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise KeywordError(f"-k {self.expression!r}: unexpected end of expression")
        self.pos += 1
        return token

    def _chain(self, word: str, operand: Callable[[], bool]) -> list[bool]:
        """Every operand of ``operand (word operand)*``, each parsed (no short circuit: parsing
        an operand consumes its tokens)."""
        values = [operand()]
        while self._peek() == word:
            self.pos += 1
            values.append(operand())
        return values

    def parse_or(self) -> bool:
        return any(self._chain("or", self.parse_and))

    def parse_and(self) -> bool:
        return all(self._chain("and", self.parse_not))

    def parse_not(self) -> bool:
        if self._peek() == "not":
            self.pos += 1
            return not self.parse_not()
        return self.parse_atom()

    def parse_atom(self) -> bool:
        token = self._take()
        if token == "(":
            result = self.parse_or()
            if self._take() != ")":
                raise KeywordError(f"-k {self.expression!r}: missing ')'")
            return result
        if token in (")", "and", "or"):
            raise KeywordError(f"-k {self.expression!r}: unexpected {token!r}")
        needle = token.lower()
        return any(needle in name for name in self.haystack)
