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
from collections import Counter
from typing import TYPE_CHECKING

from controller.feed import Budgets, FeedHub
from controller.outputs import (
    AnswerTenant,
    Delivery,
    FeedEntry,
    Output,
    Replay,
    SendToTenant,
    TenantPeer,
)
from harmonaize.messages import Category, Message, Subscribe, encode

if TYPE_CHECKING:  # the configuration module brings the metrics server's asyncio along
    from controller.config import FeedSection

log = logging.getLogger("harmonaize.controller")

#: The controller's name on the wire.
SENDER = "controller"


def budgets(feed: FeedSection) -> Budgets:
    return Budgets(feed.request_rate, feed.request_burst, feed.replay_rate, feed.replay_burst)


class Publications:
    def __init__(self, cfg: FeedSection, seqs: dict[str, int],
                 latest: dict[str, tuple[int, bytes]], epoch: int) -> None:
        self.cfg = cfg
        self.seqs = seqs
        #: Each topic's newest condition (seq, frame).
        self.latest = latest
        self.epoch = epoch
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

    def publish(self, body: Message, topic: str, wall: float) -> list[SendToTenant]:
        """Number, encode and stage one publication; its sends, for after the commit."""
        seq = self.seqs[topic] = self.seqs.get(topic, 0) + 1
        self._dirty[topic] = seq
        frame = encode(body, sender=SENDER, seq=seq, now=wall)
        condition = body.CATEGORY is Category.CONDITION
        if condition:
            self.latest[topic] = (seq, frame)
        self._log.append(FeedEntry(topic, seq, condition, frame))
        self.stats["published"] += 1
        return [SendToTenant(sub.peer, topic, frame) for sub in self.hub.targets(topic)]

    def republish(self) -> list[SendToTenant]:
        """Every condition again as it was (same sequence number)."""
        return [SendToTenant(sub.peer, topic, frame)
                for topic, (_, frame) in self.latest.items() for sub in self.hub.targets(topic)]

    def take_dirty(self) -> tuple[dict[str, int], tuple[FeedEntry, ...]]:
        dirty, self._dirty = self._dirty, {}
        entries, self._log = tuple(self._log), []
        return dirty, entries

    # --- subscribers -----------------------------------------------------------------------

    def subscribe(self, peer: TenantPeer, request: Subscribe, now: float) -> list[Output]:
        """The answer, then the present for a new subscriber and what a resumed one missed."""
        hub, tenant = self.hub, peer.tenant
        new = peer.peer not in hub.subscribers
        result = hub.subscribe(peer.peer, tenant, request, now, self.seqs, epoch=self.epoch)
        for refusal in result.reply.refused:
            self.stats["refused_subscriptions"] += 1
            log.warning("refused tenant %r a subscription to %r: %s", tenant or "(no key)",
                        refusal.topic, refusal.reason)
        if new:
            self.stats["subscriptions"] += 1
        out: list[Output] = [AnswerTenant(peer.peer, result.reply)]
        if peer.peer not in hub.subscribers:
            return out
        for topic in result.conditions:  # a late joiner gets the present at once
            latest = self.latest.get(topic)
            if latest is not None:
                out.append(SendToTenant(peer.peer, topic, latest[1]))
        chunk = min(self.cfg.retention, max(1, self.cfg.send_hwm // 2))
        for topic, after in result.replay:
            newest = self.seqs.get(topic, 0)
            retained_from = newest - self.cfg.retention + 1
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

    def expire(self, now: float) -> None:
        for sub in self.hub.expire(now):
            self.stats["lapsed"] += 1
            log.info("tenant %r's subscription lapsed (not renewed)", sub.tenant)

    def next_expiry(self) -> float | None:
        """When the first subscription lapses unless renewed."""
        return min((s.renew_by for s in self.hub.subscribers.values()), default=None)

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
