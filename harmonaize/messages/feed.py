"""The tenant's feed: what a tenant receives (pool capacity, job health, advisories), its
subscriptions, and the answers to its requests with their error codes.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from harmonaize.messages.core import (
    Category,
    Message,
    message,
)
from harmonaize.messages.negotiation import Negotiated
from harmonaize.messages.values import (
    Bucket,
    Level,
    Trend,
)
from harmonaize.schema import (
    Count,
    Ident,
    Len,
    Name,
    Num,
    Str,
    Text,
)


class Advice(StrEnum):
    CHECKPOINT_NOW = "checkpoint-now"


class Urgency(StrEnum):
    ELEVATED = "elevated"
    HIGH = "high"


@message("job-advisory", Category.EVENT)
@dataclass(frozen=True)
class JobAdvisory(Message):
    """Advice for one job, in the job's own terms: no host, GPU or raw value."""

    #: The job, as the provider's scheduler named it.
    job: Ident
    advice: Advice
    #: A coarse class: gpu-memory, gpu-failure, interconnect, thermal.
    reason: Ident
    urgency: Urgency
    #: The job's ranks on the affected hardware, as its launcher named them.
    ranks: Annotated[tuple[Ident, ...], Len(1024)] = ()


@message("pool-capacity", Category.CONDITION)
@dataclass(frozen=True)
class PoolCapacity(Message):
    """Hosts of one GPU class in one pool that can take work, in coarse buckets."""

    pool: Ident
    gpu_class: Ident
    #: Hosts that can take work (private mode: not released, read 0 or more).
    hosts_up: Bucket
    #: Hosts that cannot (down, drained or unhealthy).
    hosts_down: Bucket
    #: Healthy, idle GPUs on hosts that can take work.
    gpus_available: Bucket
    #: The direction of the last visible change of (free GPUs, hosts up).
    trend: Trend
    #: Bumped whenever the visible content changes; republishing keeps it.
    revision: Count


class TuningStatus(StrEnum):
    """How the job's retuning stands, as the controller sees every host's ranks."""

    STEADY = "steady"      # every rank answers alike; no change is waiting
    PAUSED = "paused"      # ranks wait at a switching point for its confirmation
    DIVERGED = "diverged"  # ranks answered differently at some collective: the job may hang


@message("job-health", Category.CONDITION)
@dataclass(frozen=True)
class JobHealth(Message):
    """A job's members as the tenant knows them: which are degraded or lost, and how
    congested the job's network paths are. Never a host, address or other tenant."""

    #: The job, as the provider's scheduler named it.
    job: Ident
    #: Members (ranks or instance names) on hardware that is degraded or out of service.
    degraded: Annotated[tuple[Ident, ...], Len(1024)] = ()
    #: Members on hardware that is down or lost.
    lost: Annotated[tuple[Ident, ...], Len(1024)] = ()
    #: The worst congestion on the data links of the job's hosts.
    congestion: Level = Level.NONE
    #: Bumped whenever the content changes; republishing keeps it.
    revision: Count = 0
    #: The choice of the job's declared tuning ranges in force (``default``: NCCL's own).
    tuning_choice: Name = "default"
    #: Whether every rank follows it alike (see :class:`TuningStatus`).
    tuning: TuningStatus = TuningStatus.STEADY
    #: The share of its GPUs' energy the power limits saved since it started, in percent,
    #: as a coarse range; None: the job declared no slowdown for energy, or too little is
    #: measured yet.
    energy: Bucket | None = None


#: A feed topic, or a prefix of topics: ``pool/<pool>/<class>``, ``job/<tenant>/<job>/``.
Topic = Annotated[str, Str(max_len=256, pattern=r"[A-Za-z0-9._:@+/-]*")]


@dataclass(frozen=True)
class Position:
    """The newest sequence number seen (or published) on one topic."""

    topic: Topic
    #: Sequence numbers are per topic, start at 1 and have no holes.
    seq: Count


@message("subscribe", Category.CONTROL)
@dataclass(frozen=True)
class Subscribe(Message):
    """A tenant's subscription to topic prefixes, renewed periodically.

    ``since`` says where the tenant left off per topic; the controller sends
    what it still retains after those points, so a restarted tenant or one that
    saw a gap misses nothing.
    """

    #: Topic prefixes: ``pool/`` (or narrower) and ``job/<you>/`` (or narrower).
    topics: Annotated[tuple[Topic, ...], Len(64, min_len=1)]
    #: Per topic, the newest sequence number you have: what is retained after it is
    #: sent again. Omit a topic to get its present condition only (a fresh start).
    since: Annotated[tuple[Position, ...], Len(1024)] = ()
    #: The feed epoch ``since`` belongs to (from ``Subscribed.epoch``); 0: none known.
    #: Positions of another epoch mean nothing: the controller then replays everything
    #: it retains on the accepted topics.
    epoch: Count = 0


class ErrorCode(StrEnum):
    """Why a tenant's request was refused, for programs (``Reply.code``, ``Refusal.code``
    and the HTTP gateway's ``error.code``); the text beside it is for people. New codes
    may be added within a wire version: treat an unknown one as a refusal."""

    MALFORMED = "malformed"
    INVALID = "invalid"
    NOT_AUTHENTICATED = "not-authenticated"
    THROTTLED = "throttled"
    TOO_BROAD = "too-broad"
    NOT_YOUR_JOB = "not-your-job"
    NO_SUCH_TOPIC = "no-such-topic"
    TOO_MANY_SUBSCRIPTIONS = "too-many-subscriptions"
    NOT_PLACED = "not-placed"
    STALE_REVISION = "stale-revision"
    PROVIDER_FIELD = "provider-field"
    NO_SUCH_NOTICE = "no-such-notice"
    NOT_DEFERRABLE = "not-deferrable"
    NOTICE_STARTED = "notice-started"
    NOT_FOUND = "not-found"
    UNAVAILABLE = "unavailable"


#: What each code means (the published spec and the guides list them from here).
ERROR_MEANINGS: dict[ErrorCode, str] = {
    ErrorCode.MALFORMED: "not a frame, not JSON, or not one message",
    ErrorCode.INVALID: "a field is missing, unknown or out of range, an unknown message "
                       "kind, or a cursor beyond the present; the text names it",
    ErrorCode.NOT_AUTHENTICATED: "no tenant identity (key, token or certificate): pool "
                                 "topics only",
    ErrorCode.THROTTLED: "over the tenant's request budget; retry later (HTTP only: the "
                         "ZeroMQ feed drops such requests)",
    ErrorCode.TOO_BROAD: "a topic prefix above pool/ or job/<you>/ (it would reach other "
                         "tenants' topics)",
    ErrorCode.NOT_YOUR_JOB: "another tenant's job topics",
    ErrorCode.NO_SUCH_TOPIC: "a prefix under neither pool/ nor job/",
    ErrorCode.TOO_MANY_SUBSCRIPTIONS: "more topic prefixes than a tenant may hold at once",
    ErrorCode.NOT_PLACED: "no such job of yours is placed (the same answer for another "
                          "tenant's job)",
    ErrorCode.STALE_REVISION: "a declaration older than the revision in force",
    ErrorCode.PROVIDER_FIELD: "a field only the provider sets (declaration.group)",
    ErrorCode.NO_SUCH_NOTICE: "no validation notice of yours has that id (the same answer "
                              "for another tenant's)",
    ErrorCode.NOT_DEFERRABLE: "the notice was deferred once already, or the job's "
                              "declaration allows no deferral",
    ErrorCode.NOTICE_STARTED: "the validation started or was cancelled: nothing to answer",
    ErrorCode.NOT_FOUND: "HTTP only: no such resource, or not that method on it",
    ErrorCode.UNAVAILABLE: "a controller replica could not take it now (its cluster has no "
                           "leader for a moment): retry",
}


@dataclass(frozen=True)
class Refusal:
    """A topic prefix of a subscription that was not accepted, and why."""

    topic: Topic
    reason: Text
    #: One of :class:`ErrorCode` (kept a string: newer controllers may add codes).
    code: Name = ""


@message("subscribed", Category.CONTROL)
@dataclass(frozen=True)
class Subscribed(Message):
    """The answer to a subscription: what was accepted, what was refused and why."""

    #: Who the controller takes the tenant to be (from its key; empty without one).
    tenant: Name
    accepted: Annotated[tuple[Topic, ...], Len(64)] = ()
    refused: Annotated[tuple[Refusal, ...], Len(64)] = ()
    #: The newest sequence number of every topic under the accepted prefixes.
    positions: Annotated[tuple[Position, ...], Len(1024)] = ()
    #: Renew within this many seconds, or the subscription lapses.
    renew: Annotated[float, Num(0.1, 86400.0)] = 30.0
    #: This feed's epoch. It changes only when the controller's database was begun
    #: anew, and then every sequence number starts again from 1: a client holding
    #: positions of another epoch must forget them (it gets a replay of what is retained).
    epoch: Count = 0
    #: For topics whose resume (``since``) asked for more than is retained: the oldest
    #: sequence number still retained. What lies between is lost for good.
    oldest: Annotated[tuple[Position, ...], Len(1024)] = ()
    #: The ``subscribe``'s own request number (its envelope's ``seq``; 0 for a stream
    #: of the HTTP gateway), so that an answer is matched to its request even when an
    #: earlier request was dropped unanswered (over the request budget).
    request: Count = 0


@message("reply", Category.CONTROL)
@dataclass(frozen=True)
class Reply(Message):
    """The answer to a tenant's request (by the request's sequence number)."""

    #: The request's own sequence number (its envelope's ``seq``).
    request: Count
    ok: bool
    #: Why not, in words (empty when ``ok``).
    error: Text = ""
    #: One of :class:`ErrorCode` when ``ok`` is false (a string: codes may be added).
    code: Name = ""
    #: A negotiation request's answer (one), or a ``negotiation-list``'s (each of yours).
    negotiation: Annotated[tuple[Negotiated, ...], Len(256)] = ()
