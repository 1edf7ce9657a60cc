"""Hosts' summaries as plain values and as stored bytes, made once per summary object.

Every Commit writes each host it touched whole, summary included, to the bus (as plain
values) and to the mirror or database (as msgpack bytes). Most of those summaries are
the host's last one again (the agent's periodic refresh: the core keeps the summary it
had when the new one is equal), so the same object is turned into plain values commit
after commit; that walk cost more than applying the frame. Summaries are frozen, so
what an object turns into never changes: it is kept per object (by identity, the object
held so its identity is not reused), and the memo is emptied when it outgrows its bound.

The other way (a takeover's restore: every host's stored summary, then every host record
of the commits since the snapshot), equal bytes make one shared object: a region's
summaries are mostly alike, so most are checked and built once, not once per host and
per commit, and the shared object's bytes are then made once by the memos above.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import msgpack

from harmonaize.messages import HostSummary
from harmonaize.schema import from_plain, to_plain

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


class BytesMemo:
    """A summary from its msgpack bytes, one frozen object per distinct bytes."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._memo: dict[bytes, HostSummary] = {}

    def __call__(self, data: bytes) -> HostSummary:
        kept = self._memo.get(data)
        if kept is not None:
            return kept
        # Checked as on the wire; bytes that fail raise and are not remembered.
        summary = from_plain(HostSummary, msgpack.unpackb(data))
        if len(self._memo) >= self._limit:
            self._memo.clear()
        self._memo[data] = summary
        return summary


#: A summary from the bytes the store keeps (or a Commit's plain values, packed).
summary_unpacked = BytesMemo()
