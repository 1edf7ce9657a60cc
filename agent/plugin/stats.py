"""The per-process stats file the plugin writes: each communicator's slot (what its rank
follows, where it switched, whether it waits, refused or defers) and its parsing. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from agent.plugin.policy import _SLOT_COLD, _SLOT_HOT, Held

FLAG_MAPPED = 0x1


FLAG_HELD_PENDING = 0x2


FLAG_WAITING = 0x4


FLAG_REFUSED = 0x8


FLAG_DEFERRED = 0x10


FLAG_CHANNELS = 0x20


FLAG_LISTED = 0x40


FLAG_INVALID = 0x80


@dataclass(frozen=True)
class StatsSlot:
    """One live tuner context (a rank of a communicator) in a tenant process."""

    pid: int
    comm_id: int
    n_ranks: int
    n_nodes: int
    #: Collectives this context has completed: the index of its next one.
    collectives: int
    flags: int = FLAG_MAPPED
    #: The entry it follows (revision 0: none, NCCL's own choices).
    revision: int = 0
    at: int = 0
    before_hash: int = 0
    after_hash: int = 0
    #: Where its answer last changed, how often, and a hash chain over every change.
    last_switch: int = 0
    history: int = 0
    prev_history: int = 0
    switches: int = 0
    refused_revision: int = 0
    #: The policy file it maps (device, inode); (0, 0) when none.
    policy_file: tuple[int, int] = (0, 0)
    wait_at: int = 0
    #: Calls with no policy to follow.
    fallbacks: int = 0
    refusals: int = 0
    nccl_version: int = 0
    #: Which process file (pid and random tag): tells apart pids of other namespaces.
    tag: int = 0

    @property
    def held(self) -> Held:
        return Held(bool(self.flags & FLAG_LISTED), self.at, self.before_hash,
                    self.after_hash, self.revision, bool(self.flags & FLAG_HELD_PENDING))

    @property
    def waiting(self) -> bool:
        return bool(self.flags & FLAG_WAITING)

    @property
    def refused(self) -> bool:
        return bool(self.flags & FLAG_REFUSED)

    @property
    def deferred(self) -> bool:
        return bool(self.flags & FLAG_DEFERRED)

    @property
    def mapped(self) -> bool:
        return bool(self.flags & FLAG_MAPPED)

    @property
    def key(self) -> tuple[int, int, int]:
        """This context among all of the host's (process, file, communicator)."""
        return (self.pid, self.tag, self.comm_id)


class StatsSlots(list[StatsSlot]):
    """The live slots of a job, plus how many stats files were malformed and how
    many were left by processes that died (removed as they are found); and of one
    bounded read: files over the caps (``excess``), files left to the next read
    (``deferred``), slots left mid-update (``stale``), file reads made (``reads``)."""

    def __init__(self, slots: Iterable[StatsSlot] = (), malformed: int = 0,
                 dead: int = 0) -> None:
        super().__init__(slots)
        self.malformed = malformed
        self.dead = dead
        self.excess = 0
        self.deferred = 0
        self.stale = 0
        self.reads = 0


STATS_NAME = re.compile(r"([0-9]{1,10})-([0-9a-f]{16})\.stats")


def parse_slot(data: bytes, offset: int, pid: int, nccl: int, tag: int) -> StatsSlot | None:
    comm_id, n_ranks, n_nodes, collectives, in_use, _ = _SLOT_HOT.unpack_from(data, offset)
    if in_use not in (0, 1):
        raise ValueError("in_use")
    if not in_use:
        return None
    (flags, revision, at, before, after, last_switch, history, prev_history, switches, refused,
     dev, ino, wait_at, fallbacks, refusals) = _SLOT_COLD.unpack_from(data, offset + _SLOT_HOT.size)
    return StatsSlot(pid, comm_id, n_ranks, n_nodes, collectives, flags, revision, at, before,
                     after, last_switch, history, prev_history, switches, refused, (dev, ino),
                     wait_at, fallbacks, refusals, nccl, tag)
