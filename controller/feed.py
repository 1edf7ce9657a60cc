"""Tenants' subscriptions: who may see which topics, and who gets a publication.

Sans-I/O. The server hands in subscription requests with the tenant's
identity (from its CurveZMQ key, never from the request) and asks, per
publication, which connections get it. The rules:

* ``pool/...`` prefixes are open to every tenant (with auth.mode = "none",
  to anyone who can connect);
* ``job/<tenant>/...`` only to that tenant, and only with the slash, so
  ``job/acme`` cannot reach ``job/acme2/``;
* anything else -- ``""``, ``job/``, another tenant's jobs -- is refused, with
  a code (:class:`~harmonaize.messages.ErrorCode`) and the reason, and counted.

A subscription lapses unless it is renewed within ``renew`` seconds, so the
table stays bounded by live tenants, whatever they do.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from harmonaize.messages import ErrorCode, Position, Refusal, Subscribe, Subscribed

POOL_PREFIX = "pool/"
JOB_PREFIX = "job/"
#: Subscriptions one tenant may hold at once (over all its connections).
MAX_PER_TENANT = 256


def refusal(tenant: str, prefix: str) -> tuple[ErrorCode, str] | None:
    """Why ``tenant`` may not subscribe to ``prefix`` (a code and words); None if it may."""
    if prefix.startswith(POOL_PREFIX):
        return None
    if not tenant:
        return (ErrorCode.NOT_AUTHENTICATED,
                "not authenticated: job topics need a tenant key")
    if prefix.startswith(f"{JOB_PREFIX}{tenant}/"):
        return None
    if POOL_PREFIX.startswith(prefix) or f"{JOB_PREFIX}{tenant}/".startswith(prefix):
        # "", "job/", "job/acme": above what is yours, so other tenants' topics too.
        return (ErrorCode.TOO_BROAD,
                f"too broad: subscribe to {POOL_PREFIX} or {JOB_PREFIX}{tenant}/")
    if prefix.startswith(JOB_PREFIX):
        return ErrorCode.NOT_YOUR_JOB, "not your job"
    return ErrorCode.NO_SUCH_TOPIC, "no such topic"


def stream_of(topic: str) -> str:
    """The stream a topic's publications are also counted in: ``pool`` for every pool
    topic (every tenant may see them all), ``job/<tenant>`` for one tenant's job topics.
    A stream's count (its offset) says nothing about anyone else's topics, so an HTTP
    client's cursor can be a pair of them instead of a position per topic."""
    if topic.startswith(POOL_PREFIX):
        return "pool"
    parts = topic.split("/", 2)
    return f"{parts[0]}/{parts[1]}" if len(parts) > 2 else topic


def streams_of(tenant: str) -> tuple[str, str]:
    """The streams a tenant may see: the pools', and its own jobs'."""
    return "pool", f"{JOB_PREFIX}{tenant}"


def may_see(tenant: str, topic: str) -> bool:
    return refusal(tenant, topic) is None


@dataclass
class Subscriber:
    peer: bytes
    tenant: str
    prefixes: tuple[str, ...]
    since: float
    renew_by: float
    sent: int = 0
    dropped: int = 0
    refused: int = 0

    def wants(self, topic: str) -> bool:
        return topic.startswith(self.prefixes)


@dataclass
class Subscription:
    """What the server does after a subscription request."""

    reply: Subscribed
    #: (topic, after seq): retained messages to resend, oldest first.
    replay: list[tuple[str, int]] = field(default_factory=list)
    #: Topics whose current condition a new subscriber should get at once.
    conditions: list[str] = field(default_factory=list)


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up."""

    rate: float
    burst: float
    tokens: float = -1.0  # full at the first use
    at: float = 0.0

    def take(self, want: int, now: float) -> int:
        """Take up to ``want`` tokens; returns how many were granted."""
        if self.tokens < 0:
            self.tokens = self.burst
        else:
            self.tokens = min(self.burst, self.tokens + max(0.0, now - self.at) * self.rate)
        self.at = now
        granted = max(0, min(want, int(self.tokens)))
        self.tokens -= granted
        return granted


@dataclass(frozen=True)
class Budgets:
    """What one tenant may cost the controller (over all its connections)."""

    #: Requests (subscriptions, renewals, declarations) a second, and saved up.
    request_rate: float = 20.0
    request_burst: float = 100.0
    #: Retained messages replayed a second, and saved up.
    replay_rate: float = 2000.0
    replay_burst: float = 10000.0


@dataclass
class FeedHub:
    renew: float = 30.0
    subscribers: dict[bytes, Subscriber] = field(default_factory=dict)
    refused: int = 0
    budgets: Budgets = field(default_factory=Budgets)
    #: Per tenant (one entry per key on file, so bounded): its requests and replays.
    _requests: dict[str, TokenBucket] = field(default_factory=dict)
    _replays: dict[str, TokenBucket] = field(default_factory=dict)
    #: Per tenant: the prefixes its subscribers hold, so that a subscription's check of
    #: the tenant's limit does not look at every other subscriber (thousands of them).
    _held: dict[str, int] = field(default_factory=dict)
    #: No subscription lapses before this (a bound, exact after each :meth:`expire`):
    #: renewals only move lapses later, so the loop need not look at every subscriber
    #: after every batch to know when to look again.
    earliest: float = math.inf
    #: Per topic, the peers subscribed to it, kept until who subscribes to what changes
    #: (a renewal of the same prefixes changes nothing): a publication to thousands of
    #: subscribers does not ask each of them again.
    _peers: dict[str, list[bytes]] = field(default_factory=dict)
    #: Per topic, the publications handed to its kept peers and not yet counted into
    #: each subscriber's ``sent`` (a fan-out counts once, not once per subscriber;
    #: :meth:`settle` counts them, before the kept peers are forgotten).
    _handed: dict[str, int] = field(default_factory=dict)

    def configure(self, budgets: Budgets) -> None:
        """A reload's budgets apply to every tenant at once, not only to tenants first
        seen after it: each bucket takes the new rate and burst, and keeps what it has
        saved up to the new burst."""
        self.budgets = budgets
        for buckets, rate, burst in ((self._requests, budgets.request_rate,
                                      budgets.request_burst),
                                     (self._replays, budgets.replay_rate,
                                      budgets.replay_burst)):
            for bucket in buckets.values():
                bucket.rate, bucket.burst = rate, burst
                bucket.tokens = min(bucket.tokens, burst)

    def admit(self, tenant: str, now: float) -> bool:
        """Whether the tenant may make one more request now."""
        bucket = self._requests.get(tenant)
        if bucket is None:
            bucket = self._requests[tenant] = TokenBucket(self.budgets.request_rate,
                                                          self.budgets.request_burst)
        return bucket.take(1, now) == 1

    def replay_allowance(self, tenant: str, want: int, now: float) -> int:
        """How many of ``want`` retained messages the tenant may be sent again now."""
        bucket = self._replays.get(tenant)
        if bucket is None:
            bucket = self._replays[tenant] = TokenBucket(self.budgets.replay_rate,
                                                         self.budgets.replay_burst)
        return bucket.take(want, now)

    def subscribe(self, peer: bytes, tenant: str, request: Subscribe, now: float,
                  topics: Mapping[str, int], *, epoch: int = 0) -> Subscription:
        """Apply a (renewed) subscription; ``topics`` is every topic's newest seq,
        ``epoch`` the feed's (positions of another one ask for everything retained)."""
        accepted: list[str] = []
        refused: list[Refusal] = []
        for prefix in dict.fromkeys(request.topics):
            why = refusal(tenant, prefix)
            if why is None and self._count(tenant, peer) + len(accepted) >= MAX_PER_TENANT:
                why = (ErrorCode.TOO_MANY_SUBSCRIPTIONS,
                       f"more than {MAX_PER_TENANT} subscriptions")
            if why is None:
                accepted.append(prefix)
            else:
                refused.append(Refusal(prefix, why[1], why[0].value))
        self.refused += len(refused)
        old = self.subscribers.get(peer)
        if old is not None:
            self._release(old)
        if old is None or old.prefixes != tuple(accepted):
            self._forget_peers()
        if accepted:
            self._held[tenant] = self._held.get(tenant, 0) + len(accepted)
            sub = self.subscribers[peer] = Subscriber(
                peer, tenant, tuple(accepted), old.since if old else now, now + self.renew,
                old.sent if old else 0, old.dropped if old else 0,
                (old.refused if old else 0) + len(refused))
            self.earliest = min(self.earliest, sub.renew_by)
        elif old is not None:
            del self.subscribers[peer]
            sub = None
        else:
            sub = None
        visible = sorted(t for t in topics if sub is not None and sub.wants(t))
        since = {p.topic: p.seq for p in request.since}
        if request.epoch and request.epoch != epoch:
            # The client's positions are of a feed begun anew: they mean nothing here.
            since = dict.fromkeys(visible, 0)
        replay = [(t, since[t]) for t in visible if t in since and since[t] < topics[t]]
        # A renewal says where it is (since); a new subscriber wants the present.
        fresh = [t for t in visible if t not in since]
        reply = Subscribed(tenant, tuple(accepted), tuple(refused)[:64],
                           tuple(Position(t, topics[t]) for t in visible)[:1024], self.renew,
                           epoch)
        return Subscription(reply, replay, fresh if old is None or
                            set(accepted) - set(old.prefixes) else [])

    def _count(self, tenant: str, peer: bytes) -> int:
        """Prefixes the tenant's other subscribers hold."""
        old = self.subscribers.get(peer)
        mine = len(old.prefixes) if old is not None and old.tenant == tenant else 0
        return self._held.get(tenant, 0) - mine

    def _release(self, sub: Subscriber) -> None:
        left = self._held.get(sub.tenant, 0) - len(sub.prefixes)
        if left > 0:
            self._held[sub.tenant] = left
        else:
            self._held.pop(sub.tenant, None)

    def targets(self, topic: str) -> list[Subscriber]:
        return [s for s in self.subscribers.values() if s.wants(topic)]

    def peers(self, topic: str) -> list[bytes]:
        """The peers subscribed to ``topic`` (the list is shared: read it, never change it)."""
        found = self._peers.get(topic)
        if found is None:
            if len(self._peers) >= 4096:  # topics come and go (jobs): keep it bounded
                self._forget_peers()
            found = self._peers[topic] = [s.peer for s in self.subscribers.values()
                                          if s.wants(topic)]
        return found

    def hand(self, topic: str) -> list[bytes]:
        """The peers a publication on ``topic`` goes to now, counted as sent to each of
        them (a peer found full is counted back with :meth:`missed`)."""
        found = self.peers(topic)
        if found:
            self._handed[topic] = self._handed.get(topic, 0) + 1
        return found

    def missed(self, peer: bytes) -> None:
        """A handed publication did not fit the peer's queue: dropped, not sent."""
        sub = self.subscribers.get(peer)
        if sub is not None:
            sub.sent -= 1
            sub.dropped += 1

    def settle(self) -> None:
        """Count the handed publications into each subscriber's ``sent``."""
        handed, self._handed = self._handed, {}
        subscribers = self.subscribers
        for topic, count in handed.items():
            for peer in self._peers.get(topic, ()):
                sub = subscribers.get(peer)
                if sub is not None:
                    sub.sent += count

    def _forget_peers(self) -> None:
        self.settle()
        self._peers.clear()

    def expire(self, now: float) -> list[Subscriber]:
        gone = [s for s in self.subscribers.values() if s.renew_by < now]
        for sub in gone:
            del self.subscribers[sub.peer]
            self._release(sub)
            self._forget_peers()
        self.earliest = min((s.renew_by for s in self.subscribers.values()), default=math.inf)
        return gone

    def drop(self, peers: Iterable[bytes]) -> None:
        for peer in peers:
            sub = self.subscribers.pop(peer, None)
            if sub is not None:
                self._release(sub)
                self._forget_peers()
