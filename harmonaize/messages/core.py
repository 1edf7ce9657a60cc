"""The wire's own rules: its version and limits, the error a refused frame raises, and
the registry every message kind is entered in (by :func:`message`).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import ClassVar, TypeVar

MAGIC = "hz"
VERSION = 1
#: Largest frame any peer may send us. Summaries of a host with 8 GPUs and a
#: handful of links are a few KiB; a quarter MiB leaves room without letting a
#: peer make us allocate much.
MAX_FRAME = 256 * 1024
MAX_STR = 4096
MAX_LIST = 1024
MAX_MAP = 256

T = TypeVar("T")


class WireError(ValueError):
    """An incoming frame was rejected; the message says why."""

    #: The frame's sequence number when its envelope was readable (0: it was not),
    #: so a refusal can name the request it answers.
    seq: int = 0
    #: Whether the envelope was readable (its number known, 0 included): a wrong body
    #: or kind is then ``invalid``, an unreadable envelope ``malformed``.
    readable: bool = False

    @classmethod
    def of_request(cls, text: str, seq: int) -> WireError:
        """A refusal of a request whose envelope was read: it names the request."""
        error = cls(text)
        error.seq, error.readable = seq, True
        return error


class Category(StrEnum):
    CONTROL = "control"
    CONDITION = "condition"
    EVENT = "event"


class Message:
    """Base of every registered message (gives type checkers the class vars)."""

    KIND: ClassVar[str]
    CATEGORY: ClassVar[Category]


_REGISTRY: dict[str, type[Message]] = {}


def message(kind: str, category: Category) -> Callable[[type[T]], type[T]]:
    """Register a frozen dataclass as a wire message of ``kind``."""

    def register(cls: type[T]) -> type[T]:
        if kind in _REGISTRY:
            raise ValueError(f"message kind {kind!r} registered twice")
        cls.KIND = kind  # type: ignore[attr-defined]
        cls.CATEGORY = category  # type: ignore[attr-defined]
        _REGISTRY[kind] = cls  # type: ignore[assignment]
        return cls

    return register


def kinds() -> dict[str, type[Message]]:
    return dict(_REGISTRY)


def registered(kind: str) -> type[Message] | None:
    """The message type registered as ``kind`` (None: no such kind), without a copy of
    the registry: :func:`decode` asks for every frame."""
    return _REGISTRY.get(kind)
