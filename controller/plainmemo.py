"""Hosts' summaries as plain values and as stored bytes, made once per summary object.

Every Commit writes each host it touched whole, summary included, to the bus (as plain
values) and to the mirror or database (as msgpack bytes). Most of those summaries are
the host's last one again (the agent's periodic refresh: the core keeps the summary it
had when the new one is equal), so the same object is turned into plain values commit
after commit; that walk cost more than applying the frame. Summaries are frozen, so
what an object turns into never changes: it is kept per object (by identity, the object
held so its identity is not reused), and the memo is emptied when it outgrows its bound.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgpack

from harmonaize.messages import HostSummary
from harmonaize.schema import to_plain

T = TypeVar("T")
#: Objects remembered at most (a region's hosts, twice, before the memo starts again).
LIMIT = 200_000


class IdentityMemo(Generic[T]):
    def __init__(self, make: Callable[[HostSummary], T], limit: int = LIMIT) -> None:
        self._make = make
        self._limit = limit
        self._memo: dict[int, tuple[HostSummary, T]] = {}

    def __call__(self, summary: HostSummary) -> T:
        kept = self._memo.get(id(summary))
        if kept is not None and kept[0] is summary:
            return kept[1]
        value = self._make(summary)
        if len(self._memo) >= self._limit:
            self._memo.clear()
        self._memo[id(summary)] = (summary, value)
        return value


def _packed(summary: HostSummary) -> bytes:
    return msgpack.packb(to_plain(summary))


#: A summary as plain values (the bus's Commits carry it so).
summary_plain: IdentityMemo[Any] = IdentityMemo(to_plain)
#: A summary as the store keeps it (msgpack of its plain values).
summary_packed: IdentityMemo[bytes] = IdentityMemo(_packed)
