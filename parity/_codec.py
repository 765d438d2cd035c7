"""JSON round-trip for the harness's frozen dataclasses, driven by their type hints.

``to_json`` turns a dataclass (or enum, tuple, dict) into plain JSON values; ``from_json(cls,
data)`` rebuilds it, restoring tuples, nested dataclasses, enums and int dict keys from the
annotations. Only the shapes the result types use are supported.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from functools import cache
from typing import Any, TypeVar, Union

T = TypeVar("T")


def plain(value: Any) -> Any:
    """``value`` as JSON-like data (tuples become lists, dict keys strings): the form in which
    values are compared and stored in reports."""
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return value


def to_json(value: Any) -> Any:
    """Plain JSON values (dict, list, str, int, float, bool, None) for ``value``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        if hasattr(value, "to_json") and not hasattr(value, "__parity_codec__"):
            return value.to_json()
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def from_json(cls: Any, data: Any) -> Any:
    """Rebuild a value of type ``cls`` from ``to_json`` output."""
    origin = typing.get_origin(cls)
    if cls is Any or cls is object:
        return data
    if origin in (Union, types.UnionType):
        return _from_union(typing.get_args(cls), data)
    if origin is typing.Literal:
        return data
    if origin is tuple:
        args = typing.get_args(cls)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(from_json(args[0], v) for v in data)
        return tuple(from_json(a, v) for a, v in zip(args, data, strict=True))
    if origin is list:
        (arg,) = typing.get_args(cls)
        return [from_json(arg, v) for v in data]
    if origin is dict:
        key_type, value_type = typing.get_args(cls)
        return {from_json(key_type, k): from_json(value_type, v) for k, v in data.items()}
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return cls(data)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        if hasattr(cls, "from_json") and not hasattr(cls, "__parity_codec__"):
            return cls.from_json(data)
        hints = _hints(cls)
        unknown = set(data) - set(hints)
        if unknown:
            raise ValueError(f"unknown {cls.__name__} fields: {sorted(unknown)}")
        return cls(**{name: from_json(hints[name], value) for name, value in data.items()})
    if cls is int and isinstance(data, str):
        return int(data)
    if cls is float and isinstance(data, int):
        return float(data)
    return data


def _from_union(args: tuple[Any, ...], data: Any) -> Any:
    if data is None and type(None) in args:
        return None
    candidates = [arg for arg in args if arg is not type(None) and _accepts(arg, data)]
    for index, arg in enumerate(candidates):
        if index == len(candidates) - 1:
            return from_json(arg, data)
        try:  # several dataclasses accept a dict: the first whose fields fit
            return from_json(arg, data)
        except (ValueError, TypeError, KeyError):
            continue
    raise ValueError(f"{data!r} matches none of {args}")


def _accepts(cls: Any, data: Any) -> bool:
    origin = typing.get_origin(cls) or cls
    if origin in (tuple, list):
        return isinstance(data, list)
    if origin is dict or (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return isinstance(data, dict)
    if origin is typing.Literal:
        return data in typing.get_args(cls)
    if cls is float:
        return isinstance(data, int | float) and not isinstance(data, bool)
    if cls is int:
        return isinstance(data, int) and not isinstance(data, bool)
    if isinstance(cls, type) and issubclass(cls, enum.Enum):
        return data in {member.value for member in cls}
    return isinstance(data, cls) if isinstance(cls, type) else True


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class JsonMixin:
    """``to_json`` / ``from_json`` / equality-preserving round-trip for a frozen dataclass."""

    __parity_codec__ = True

    def to_json(self) -> dict[str, Any]:
        return typing.cast(dict[str, Any], to_json(self))

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        return typing.cast(T, from_json(cls, data))
