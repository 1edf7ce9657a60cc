"""The tenant feed's numbering and delivery, with no I/O.

Sequence numbers are per topic, so a tenant's gaps say nothing about traffic on
topics it cannot see. Each publication is numbered, encoded once and staged for
the feed log; the core hands the log to the shell with the batch's state, and
the sends to every subscriber after it. Each topic's newest condition is kept
for late joiners and for republication (the same frame, the same number: a
safety net, never news).

Who may subscribe to what is :mod:`controller.feed`'s; here a subscription's
answer, its late-joiner conditions and its replay are worked out. A resumed
subscriber gets what it missed a queue's worth at a time and asks again for the
rest, so a replay never overflows its own queue; the replay budget bounds what
one tenant may cost.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING

from controller.feed import Budgets, FeedHub, may_see, stream_of, streams_of
from controller.outputs import (
    AnswerTenant,
    Delivery,
    FanOut,
    FeedEntry,
    Output,
    Replay,
    SendToTenant,
    TenantPeer,
)
from harmonaize.messages import Category, Message, Position, Subscribe, Subscribed, encode

if TYPE_CHECKING:  # the configuration module brings the metrics server's asyncio along
    from controller.config import FeedSection

log = logging.getLogger("harmonaize.controller")

#: The controller's name on the wire.
SENDER = "controller"


def budgets(feed: FeedSection) -> Budgets:
    return Budgets(feed.request_rate, feed.request_burst, feed.replay_rate, feed.replay_burst)


class Publications:
    def __init__(self, cfg: FeedSection, seqs: dict[str, int],
                 latest: dict[str, tuple[int, bytes, int]], epoch: int,
                 offsets: dict[str, int] | None = None) -> None:
        self.cfg = cfg
        self.seqs = seqs
        #: Each topic's newest condition (seq, frame, offset).
        self.latest = latest
        self.epoch = epoch
        #: Each stream's newest offset (controller/feed.py:stream_of).
        self.offsets = offsets if offsets is not None else {}
        self._dirty_offsets: dict[str, int] = {}
        #: A copy of a feed numbered elsewhere (a cluster replica's): it may be behind
        #: what a tenant already saw at another replica, and catches up.
        self.follower = False
        self.hub = FeedHub(renew=cfg.renew, budgets=budgets(cfg))
        #: Feed and request counters (controller/selfmetrics.py names them).
        self.stats: Counter[str] = Counter()
        self._dirty: dict[str, int] = {}
        self._log: list[FeedEntry] = []

    def configure(self, cfg: FeedSection) -> None:
        self.cfg = cfg
        self.hub.renew = cfg.renew
        self.hub.configure(budgets(cfg))

    # --- publication ---------------------------------------------------------------------

    def publish(self, body: Message, topic: str, wall: float) -> list[FanOut]:
        """Number, encode and stage one publication; its send, for after the commit."""
        seq = self.seqs[topic] = self.seqs.get(topic, 0) + 1
        self._dirty[topic] = seq
        stream = stream_of(topic)
        offset = self.offsets[stream] = self._dirty_offsets[stream] = \
            self.offsets.get(stream, 0) + 1
        frame = encode(body, sender=SENDER, seq=seq, now=wall)
        condition = body.CATEGORY is Category.CONDITION
        if condition:
            self.latest[topic] = (seq, frame, offset)
        self._log.append(FeedEntry(topic, seq, condition, frame, stream, offset))
        self.stats["published"] += 1
        return self._fan_out(topic, frame, offset)

    def _fan_out(self, topic: str, frame: bytes, offset: int) -> list[FanOut]:
        peers = self.hub.hand(topic)
        return [FanOut(peers, topic, frame, offset)] if peers else []

    def accept(self, entries: list[FeedEntry]) -> list[FanOut]:
        """Publications numbered elsewhere (a cluster's leader): kept as numbered, each
        once (one already had is skipped), and sent to this replica's subscribers."""
        sends: list[FanOut] = []
        for entry in entries:
            if entry.seq <= self.seqs.get(entry.topic, 0):
                continue  # had it (a leader that took over published it again)
            self.seqs[entry.topic] = self._dirty[entry.topic] = entry.seq
            if entry.offset > self.offsets.get(entry.stream, 0):
                self.offsets[entry.stream] = self._dirty_offsets[entry.stream] = entry.offset
            if entry.condition:
                self.latest[entry.topic] = (entry.seq, entry.frame, entry.offset)
            self._log.append(entry)
            self.stats["published"] += 1
            sends += self._fan_out(entry.topic, entry.frame, entry.offset)
        return sends

    def republish(self) -> list[FanOut]:
        """Every condition again as it was (same sequence number)."""
        return [send for topic, (_, frame, _) in self.latest.items()
                for send in self._fan_out(topic, frame, 0)]

    def heads(self, tenant: str) -> tuple[int, int]:
        """The newest offsets of the two streams the tenant may see (pool, its jobs)."""
        pool, jobs = streams_of(tenant)
        return self.offsets.get(pool, 0), self.offsets.get(jobs, 0)

    def forget(self, topic: str) -> None:
        """A topic with no present any more (its job was unplaced): its last condition is
        neither republished nor sent to new subscribers; what was published stays in
        the log for resumes."""
        self.latest.pop(topic, None)

    def take_dirty(self) -> tuple[dict[str, int], tuple[FeedEntry, ...], dict[str, int]]:
        dirty, self._dirty = self._dirty, {}
        entries, self._log = tuple(self._log), []
        offsets, self._dirty_offsets = self._dirty_offsets, {}
        return dirty, entries, offsets

    # --- subscribers -----------------------------------------------------------------------

    def subscribe(self, peer: TenantPeer, request: Subscribe, now: float, *,
                  number: int = 0) -> list[Output]:
        """The answer (naming the request's ``number``, its envelope's seq), then the
        present for a new subscriber and what a resumed one missed."""
        hub, tenant = self.hub, peer.tenant
        new = peer.peer not in hub.subscribers
        result = hub.subscribe(peer.peer, tenant, request, now, self.seqs, epoch=self.epoch)
        for refusal in result.reply.refused:
            self.stats["refused_subscriptions"] += 1
            log.warning("refused tenant %r a subscription to %r: %s", tenant or "(no key)",
                        refusal.topic, refusal.reason)
        if new:
            self.stats["subscriptions"] += 1
        # Where a resume asks for more than is retained, the answer says what is left, so
        # the client counts the loss at once instead of waiting for it.
        oldest = tuple(Position(topic, first) for topic, after in result.replay
                       if after < (first := self._retained_from(topic)) - 1)
        out: list[Output] = [AnswerTenant(peer.peer, replace(
            result.reply, oldest=oldest[:1024], request=number))]
        if peer.peer not in hub.subscribers:
            return out
        for topic in result.conditions:  # a late joiner gets the present at once
            latest = self.latest.get(topic)
            if latest is not None:
                out.append(SendToTenant(peer.peer, topic, latest[1]))
        chunk = min(self.cfg.retention, max(1, self.cfg.send_hwm // 2))
        for topic, after in result.replay:
            newest = self.seqs.get(topic, 0)
            retained_from = self._retained_from(topic)
            wanted = min(chunk, newest - max(after, retained_from - 1))
            allowed = hub.replay_allowance(tenant, wanted, now) if wanted > 0 else 0
            if allowed < wanted:
                self.stats["replays_throttled"] += 1  # the client asks again
            if allowed <= 0:
                continue
            self.stats["replays"] += 1
            self.stats["replayed_messages"] += allowed
            out.append(Replay(peer.peer, topic, after, allowed, retained_from))
        return out

    def _retained_from(self, topic: str) -> int:
        """The oldest sequence number of ``topic`` that is still retained."""
        return max(1, self.seqs.get(topic, 0) - self.cfg.retention + 1)

    def admit(self, tenant: str, now: float) -> bool:
        """Spend one request of the tenant's budget, whatever the request turns out to
        be: counted as a request, and as throttled when over budget. Every door calls it
        first, before reading more of the request than names its tenant, so that a
        flood of invalid requests costs no more answers than a flood of valid ones."""
        self.stats["requests"] += 1
        if self.hub.admit(tenant, now):
            return True
        self.stats["throttled_requests"] += 1
        return False

    def attach(self, peer: TenantPeer, topics: tuple[str, ...],
               now: float) -> Subscribed | None:
        """A stream (the HTTP gateway's) subscribes for as long as it is connected: no
        renewals, no replay here (it reads the log from its cursor itself). None: over
        the tenant's request budget."""
        hub = self.hub
        if not peer.admitted and not self.admit(peer.tenant, now):
            return None
        result = hub.subscribe(peer.peer, peer.tenant, Subscribe(topics), now, self.seqs,
                               epoch=self.epoch)
        for refusal in result.reply.refused:
            self.stats["refused_subscriptions"] += 1
            log.warning("refused tenant %r a subscription to %r: %s",
                        peer.tenant or "(no key)", refusal.topic, refusal.reason)
        sub = hub.subscribers.get(peer.peer)
        if sub is not None:
            sub.renew_by = math.inf  # it ends when the connection does (detach)
            self.stats["subscriptions"] += 1
        return result.reply

    def present(self, tenant: str, prefixes: tuple[str, ...]
                ) -> list[tuple[str, int, bytes, int]]:
        """The newest condition of every topic the tenant may see under ``prefixes``:
        (topic, seq, frame, offset), oldest first."""
        return sorted(((topic, seq, frame, offset)
                       for topic, (seq, frame, offset) in self.latest.items()
                       if may_see(tenant, topic) and topic.startswith(prefixes)),
                      key=lambda item: item[3])

    def expire(self, now: float) -> None:
        for sub in self.hub.expire(now):
            self.stats["lapsed"] += 1
            log.info("tenant %r's subscription lapsed (not renewed)", sub.tenant)

    def next_expiry(self) -> float | None:
        """When the first subscription may lapse unless renewed (no later than it does)."""
        earliest = self.hub.earliest
        return None if math.isinf(earliest) else earliest

    def fanned(self, full: Iterable[bytes], gone: Iterable[bytes]) -> None:
        """How a :class:`FanOut` went: only the peers it did not reach are named (the
        others were counted when it was made)."""
        hub = self.hub
        for peer in full:
            if peer in hub.subscribers:
                hub.missed(peer)
                self.stats["dropped"] += 1
        gone = list(gone)
        if gone:
            found = [peer for peer in gone if peer in hub.subscribers]
            self.stats["gone"] += len(found)
            hub.drop(found)  # disconnected: it renews when it comes back

    def delivered(self, send: SendToTenant | AnswerTenant, outcome: Delivery) -> None:
        sub = self.hub.subscribers.get(send.peer)
        if isinstance(send, SendToTenant) and sub is None:
            return  # found gone by an earlier send: counted then
        if outcome is Delivery.GONE:
            self.hub.drop([send.peer])  # disconnected: it renews when it comes back
            self.stats["gone"] += 1
        elif sub is not None and isinstance(send, SendToTenant):
            if outcome is Delivery.SENT:
                sub.sent += 1
            else:
                sub.dropped += 1
                self.stats["dropped"] += 1
