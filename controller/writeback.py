"""The shell's writes to the store, paused while its disk is full.

A Commit is stored before anything that depends on it goes out. When the disk has no
room (:class:`~controller.store.StoreFull`) the controller keeps running: the batch
that did not fit is kept, in memory, with every later one, and what depends on them
waits with them. Meanwhile agents are not acknowledged (they keep their messages and
send them again), tenants' declarations and answers are refused with "try later" (the
core does that, told by :attr:`Writer.paused`) and reads are still served. Every
``retry`` seconds the kept batches are written again, all in one transaction; once they
fit, what waited goes out in order and writing goes on as before. One log line says
when writing paused and one when it resumed.

Nothing waits without bound: the kept batches are merged into one (a host's record,
a job's declaration are kept once, the newest; only events and feed messages add up,
and agents' events are not taken while paused), acknowledgements are dropped, not kept
(an agent resends and is acknowledged after the resumption), and sends beyond
:data:`MAX_WAITING` are dropped and counted (a tenant's client sees the gap and resumes
from the stored feed).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace

from controller.outputs import Output, Prune, SendToAgent, Writes
from controller.store import Store, StoreFull
from harmonaize.messages import Ack

log = logging.getLogger("harmonaize.controller")

#: Sends kept while writing is paused (the rest are dropped and counted).
MAX_WAITING = 100_000


def merged(first: Writes, then: Writes) -> Writes:
    """One batch that stores what ``first`` then ``then`` would (the store's tables are
    keyed: the later row wins; events and feed messages are appended)."""
    hosts = {h.host_id: h for h in (*first.hosts, *then.hosts)}
    return replace(
        first, hosts=tuple(hosts.values()), events=first.events + then.events,
        feed_seqs={**first.feed_seqs, **then.feed_seqs},
        feed_log=first.feed_log + then.feed_log,
        feed_offsets={**first.feed_offsets, **then.feed_offsets},
        declarations={**first.declarations, **then.declarations},
        placements={**first.placements, **then.placements},
        tuning={**first.tuning, **then.tuning}, notices={**first.notices, **then.notices},
        negotiation=None if first.negotiation is None and then.negotiation is None else
        {**(first.negotiation or {}), **(then.negotiation or {})})


@dataclass
class WriterStats:
    #: Times writing paused for want of room.
    episodes: int = 0
    #: Batches that found no room (first tries and retries).
    failed_writes: int = 0
    #: Sends dropped while paused (acknowledgements, and beyond MAX_WAITING).
    dropped_sends: int = 0


class Writer:
    def __init__(self, store: Store, retry: float) -> None:
        self.store = store
        self.retry = retry
        self.stats = WriterStats()
        #: What is not stored yet, merged into one batch (None while writing goes on),
        #: and how many batches it holds.
        self.unstored: Writes | None = None
        self.unstored_batches = 0
        #: What waits for them, in order.
        self.waiting: list[Output] = []
        #: Monotonic time writing paused (None: it goes on) and of the next retry.
        self.paused_at: float | None = None
        self.next_retry = math.inf
        self._reason = ""

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def commit(self, writes: Writes, now: float) -> bool:
        """Store a batch; False when it is kept for later (writing is, or now is,
        paused): what follows it in the same outputs must then wait too."""
        if not self.paused:
            try:
                self.store.commit(writes)
                return True
            except StoreFull as exc:
                self._pause(str(exc), now)
        self.unstored = writes if self.unstored is None else merged(self.unstored, writes)
        self.unstored_batches += 1
        return False

    def prune(self, prune: Prune, now: float) -> None:
        """Pruning waits for room like any write (nothing is lost by skipping it)."""
        if self.paused:
            return
        try:
            self.store.prune_events()
            self.store.prune_feed(prune.retention)
        except StoreFull as exc:
            self._pause(str(exc), now)

    def hold(self, out: Output) -> None:
        """A send that must wait for the unstored batches (an acknowledgement is dropped:
        the agent resends, and is acknowledged once they are stored)."""
        if (isinstance(out, SendToAgent) and isinstance(out.message, Ack)) or (
                len(self.waiting) >= MAX_WAITING):
            self.stats.dropped_sends += 1
            return
        self.waiting.append(out)

    def try_again(self, now: float) -> list[Output] | None:
        """Write the kept batches again: what waited for them, in order, once they fit;
        None while there is still no room."""
        try:
            if self.unstored is not None:
                self.store.commit(self.unstored)
        except StoreFull:
            self.stats.failed_writes += 1
            self.next_retry = now + self.retry
            return None
        assert self.paused_at is not None
        log.warning("controller.database has room again: %d batch(es) kept for %.0f s "
                    "stored, %d send(s) that waited go out; acknowledging again",
                    self.unstored_batches, now - self.paused_at, len(self.waiting))
        waiting, self.waiting, self.unstored = self.waiting, [], None
        self.unstored_batches = 0
        self.paused_at, self.next_retry = None, math.inf
        return waiting

    def view(self, now: float) -> dict[str, object]:
        return {"writing": not self.paused,
                "paused_seconds": 0.0 if self.paused_at is None
                else round(now - self.paused_at, 3),
                "reason": self._reason if self.paused else "",
                "unstored_batches": self.unstored_batches, "waiting_sends": len(self.waiting),
                "episodes": self.stats.episodes, "failed_writes": self.stats.failed_writes,
                "dropped_sends": self.stats.dropped_sends}

    def _pause(self, reason: str, now: float) -> None:
        self.stats.failed_writes += 1
        self.stats.episodes += 1
        self.paused_at, self.next_retry, self._reason = now, now + self.retry, reason
        # The one line of this episode (retries are counted, not logged).
        log.error("%s: writing paused: agents are not acknowledged and tenants' "
                  "declarations and answers are refused (try later) until it fits; reads "
                  "are still served; trying again every %g s", reason, self.retry)
