"""The wire vocabulary: every message agent, controller and tenant exchange.

Messages are frozen dataclasses registered under a *kind* and a *category*:

* ``condition`` -- level state (a host's health, a pool's capacity). Each one is
  complete in itself and is republished in full, so a late joiner only needs
  the latest one per key.
* ``event`` -- something that happened once (an XID, an advisory). Events are
  sequenced and delivered at least once; receivers de-duplicate by sequence.
* ``control`` -- protocol housekeeping (hello, heartbeat, ack).

A frame is a msgpack array ``["hz", version, kind, sender, seq, time, body]``.
:func:`decode` treats its input as hostile: it bounds the frame size, string,
list and map lengths and nesting, accepts only known kinds and the current
version, and raises :class:`WireError` for anything else.
"""

# Over 400 lines because the wire vocabulary is one table: every message type, its limits and
# the per-peer allow-lists must be read together to see what a peer may send.

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, ClassVar, TypeVar

import msgpack

from harmonaize.schema import (
    Count,
    Ident,
    Len,
    Name,
    Num,
    SchemaError,
    Seconds,
    Str,
    Text,
    Timestamp,
    from_plain,
    strict_keys,
    to_plain,
)

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


# --- shared value types --------------------------------------------------------------


class Status(StrEnum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


class Health(StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"


class Level(StrEnum):
    """A coarse level, used where an exact value would say too much."""

    NONE = "none"
    LOW = "low"
    HIGH = "high"

    @property
    def rank(self) -> int:
        return ("none", "low", "high").index(self.value)


class Trend(StrEnum):
    RISING = "rising"
    STEADY = "steady"
    FALLING = "falling"


@dataclass(frozen=True)
class Condition:
    """Level state in node-problem-detector's shape: a type and whether it holds."""

    type: Ident
    status: Status
    reason: Name = ""
    message: Text = ""
    severity: Severity = Severity.INFO
    since: Timestamp = 0.0


@dataclass(frozen=True)
class Bucket:
    """A coarse range ``lo..hi`` (``hi`` None: open above) that hides exact counts."""

    #: The lower edge (a cautious reading).
    lo: Count
    #: The upper edge (at least ``lo``); null: "or more".
    hi: Count | None

    def __post_init__(self) -> None:
        if self.hi is not None and self.hi < self.lo:
            raise ValueError(f"bucket upper bound {self.hi} is below lower bound {self.lo}")

    def __str__(self) -> str:
        if self.hi is None:
            return f"{self.lo}+"
        return str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}"

    def __contains__(self, value: int) -> bool:
        return value >= self.lo and (self.hi is None or value <= self.hi)


Conditions = Annotated[tuple[Condition, ...], Len(64)]


@dataclass(frozen=True)
class LinkHealth:
    """One class of a host's links (e.g. "data"), in coarse levels only."""

    link_class: Ident
    links: Count
    links_down: Count
    congestion: Level
    errors: Level


# --- agent -> controller -------------------------------------------------------------


@message("hello", Category.CONTROL)
@dataclass(frozen=True)
class Hello(Message):
    """First message on every connection; binds the connection to a host."""

    pool: Ident
    gpu_class: Ident
    gpus: Count
    version: Name
    #: Changes each time the agent starts; sequence numbers restart with it.
    epoch: Count
    #: Highest sequence number the agent has seen acknowledged in this epoch.
    acked: Count
    heartbeat: Annotated[float, Num(0.01, 3600.0)]


@message("heartbeat", Category.CONTROL)
@dataclass(frozen=True)
class Heartbeat(Message):
    uptime: Seconds
    #: Highest sequence number the agent has sent, so the controller sees loss.
    last_seq: Count


@dataclass(frozen=True)
class GpuCounts:
    """How many of a host's GPUs are in each health state, and how many are busy."""

    healthy: Count = 0
    suspect: Count = 0
    validating: Count = 0
    quarantined: Count = 0
    lost: Count = 0
    #: GPUs running a tenant's processes (any state).
    in_use: Count = 0

    @property
    def total(self) -> int:
        return self.healthy + self.suspect + self.validating + self.quarantined + self.lost

    @property
    def available(self) -> int:
        """GPUs that could take new work: in service (healthy or suspect) and idle."""
        return max(0, self.healthy + self.suspect - self.in_use)


@dataclass(frozen=True)
class JobEnergy:
    """One job's GPUs on a host since the job started there: the energy they used and
    what the power limits saved, in kJ. The controller sums a job's hosts and gives its
    tenant only a coarse share (controller/redaction.py)."""

    job: Ident
    used_kj: Count
    saved_kj: Count


class HoldKind(StrEnum):
    """Why a host should get no new work, for the provider's scheduler."""

    #: An operator drained the host (``harmonctl drain``).
    DRAINED = "drained"
    #: A GPU is quarantined (validation failed, an uncorrectable error, no answer).
    GPU_QUARANTINED = "gpu-quarantined"
    #: A GPU the driver no longer shows.
    GPU_LOST = "gpu-lost"
    #: A host-level validation check failed.
    VALIDATION_FAILED = "validation-failed"
    #: A condition of critical severity holds.
    CONDITION = "condition"
    #: Remediation asks the scheduler to reboot the host (resets did not help).
    REBOOT = "reboot"
    #: A GPU waits for return to the vendor; only an operator clears it.
    RMA = "rma"


@dataclass(frozen=True)
class Hold:
    """One reason a host should get no new work. For the provider's scheduler only:
    the controller turns it into a drain reason there and never shows it to a tenant."""

    kind: HoldKind
    #: The GPU's index on the host; -1: the whole host.
    gpu: Annotated[int, Num(-1, 4096)] = -1
    #: In the agent's words: the recommended action, an operator's reason, a condition.
    detail: Annotated[str, Str(max_len=200)] = ""


@message("host-summary", Category.CONDITION)
@dataclass(frozen=True)
class HostSummary(Message):
    """A host's aggregated state; raw telemetry stays on the host."""

    health: Health
    schedulable: bool
    gpus: GpuCounts = GpuCounts()
    conditions: Conditions = ()
    links: Annotated[tuple[LinkHealth, ...], Len(16)] = ()
    #: Jobs here that declared a slowdown for energy (agent/energy/engine.py).
    energy: Annotated[tuple[JobEnergy, ...], Len(64)] = ()
    #: Why the host should get no new work (empty: it may), for the scheduler.
    holds: Annotated[tuple[Hold, ...], Len(64)] = ()
    #: A validation waits for the host's jobs to end (the controller may ask the
    #: scheduler for a maintenance reservation, so no new job lands meanwhile).
    idle_wanted: bool = False


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


@message("host-event", Category.EVENT)
@dataclass(frozen=True)
class HostEvent(Message):
    reason: Ident
    severity: Severity
    message: Text = ""


@message("goodbye", Category.CONTROL)
@dataclass(frozen=True)
class Goodbye(Message):
    reason: Text = ""


class NoticeStatus(StrEnum):
    """Where a validation notice stands (after Azure Scheduled Events' ``EventStatus``)."""

    SCHEDULED = "scheduled"  # it starts at not_before, unless approved earlier or deferred
    STARTED = "started"      # the pause has begun (not_before came, or every job approved)
    CANCELLED = "cancelled"  # it will not happen as announced (a new notice comes if it does)


@message("validation-notice", Category.EVENT)
@dataclass(frozen=True)
class ValidationNotice(Message):
    """A member of the job will pause for validation: when and for how long, nothing else.

    From an agent, ``id`` is the agent's own name for the planned validation; the
    controller gives the tenant a notice id of its own and rebuilds every other field.
    A notice is sent again, with the same id, whenever its status or start moves.
    """

    #: The job, as the provider's scheduler named it.
    job: Ident
    #: The job's members (ranks, as its launcher named them) on the hardware that pauses.
    members: Annotated[tuple[Ident, ...], Len(1024)]
    #: The longest the pause can last, never more than the job's max_validation_pause.
    pause_seconds: Annotated[int, Num(0, 86400)]
    #: The same instant as ``not_before`` (the name before notices could be answered).
    starts_at: Timestamp
    #: The notice's id, to answer it with (the same on every update of one notice).
    id: Name = ""
    #: The pause starts no earlier than this (Unix time), unless the tenant approves it.
    not_before: Timestamp = 0.0
    status: NoticeStatus = NoticeStatus.SCHEDULED
    #: Seconds the tenant may still defer it by (0: it cannot be deferred, or was already).
    defer_seconds: Seconds = 0.0


@dataclass(frozen=True)
class SwitchState:
    """Where a group of ranks' answers changed: the plugin's record of it.

    ``switches`` counts the changes, ``history`` is a hash chain over every
    (collective index, ruleset) change, ``prev_history`` the chain before the
    last one, ``last_switch`` the index of the last one, and ``collectives``
    the most collectives any rank of the group completed.
    """

    switches: Count = 0
    history: Count = 0
    prev_history: Count = 0
    last_switch: Count = 0
    collectives: Count = 0


@dataclass(frozen=True)
class CommReport:
    """One NCCL communicator as this host's ranks of it stand (no rank is named).

    ``comm`` is NCCL's communicator id (its low 62 bits), ``n_ranks`` and
    ``n_nodes`` NCCL's size of the whole communicator, ``ranks`` how many of
    its ranks run here. ``choice``, ``at`` and ``pending`` say what this
    host's policy holds for it; ``ahead`` and ``behind`` are the switch
    records of the local ranks furthest along and least far along.
    """

    comm: Count
    n_ranks: Count
    n_nodes: Count
    ranks: Count
    collectives_min: Count = 0
    collectives_max: Count = 0
    per_second: Annotated[float, Num(0.0, 1e9)] = 0.0
    choice: Name = ""
    at: Count = 0
    pending: bool = False
    ahead: SwitchState = SwitchState()
    behind: SwitchState = SwitchState()
    #: Local ranks waiting at an armed switch, and ranks that refused the newest copy.
    waiting: Count = 0
    refused: Count = 0
    #: The agent found its own ranks of this communicator in disagreement.
    diverged: bool = False


@message("tuning-report", Category.EVENT)
@dataclass(frozen=True)
class TuningReport(Message):
    """What one host of a multi-host job would choose, and where its ranks stand.

    Sent while the job runs here (at least every report interval, and at once
    when something changes): the controller sets switching points from the
    progress and compares every host's switch records.
    """

    job: Ident
    #: Digest of the rules the host derived from the declaration in force.
    fingerprint: Name
    want: Ident
    #: How strongly this host wants it (0: calm ... 2: heavily congested).
    severity: Annotated[int, Num(0, 2)]
    comms: Annotated[tuple[CommReport, ...], Len(32)] = ()


class AckPhase(StrEnum):
    ARMED = "armed"        # every local rank will wait for, or take, the armed change
    REFUSED = "refused"    # the change cannot be armed here (the reason says why)
    RESOLVED = "resolved"  # the confirmation or cancellation is in the policy


@message("tuning-ack", Category.EVENT)
@dataclass(frozen=True)
class TuningAck(Message):
    """A host's answer to a tuning-arm or tuning-resolve, with its ranks' state."""

    job: Ident
    decision: Count
    phase: AckPhase
    reason: Text = ""
    comms: Annotated[tuple[CommReport, ...], Len(32)] = ()


AGENT_KINDS = frozenset({"hello", "heartbeat", "host-summary", "host-event", "job-advisory",
                         "validation-notice", "tuning-report", "tuning-ack", "goodbye"})

# --- controller -> agent -------------------------------------------------------------


@message("ack", Category.CONTROL)
@dataclass(frozen=True)
class Ack(Message):
    """Everything up to and including ``seq`` is stored durably."""

    seq: Count


@message("resync", Category.CONTROL)
@dataclass(frozen=True)
class Resync(Message):
    """The controller does not know this connection: say hello and resend."""

    reason: Text = ""


class Collective(StrEnum):
    """NCCL's collectives, as a tenant names them in a declaration."""

    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"


class Algorithm(StrEnum):
    TREE = "tree"
    RING = "ring"
    COLLNET_DIRECT = "collnet-direct"
    COLLNET_CHAIN = "collnet-chain"
    NVLS = "nvls"
    NVLS_TREE = "nvls-tree"
    PAT = "pat"


class Protocol(StrEnum):
    LL = "ll"
    LL128 = "ll128"
    SIMPLE = "simple"


Channels = Annotated[int, Num(1, 64)]
Bytes = Annotated[int, Num(0, 2**62)]


@dataclass(frozen=True)
class TuningRange:
    """For some collectives and a message-size band, what the provider may choose from.

    The provider only ever picks among entries NCCL itself enabled, and only
    lowers the channel count NCCL chose; this narrows that further.
    """

    #: The collectives this range is for.
    collectives: Annotated[tuple[Collective, ...], Len(5, min_len=1)]
    #: Algorithms the provider may choose (among those NCCL enabled).
    algorithms: Annotated[tuple[Algorithm, ...], Len(7, min_len=1)]
    #: Protocols the provider may choose (among those NCCL enabled).
    protocols: Annotated[tuple[Protocol, ...], Len(3, min_len=1)]
    #: Message sizes ``min_bytes <= n < max_bytes``.
    min_bytes: Bytes = 0
    max_bytes: Bytes = 2**62
    #: The channel range (the provider only ever lowers NCCL's own count).
    min_channels: Channels = 1
    max_channels: Channels = 64

    def __post_init__(self) -> None:
        if self.max_bytes <= self.min_bytes:
            raise ValueError("max_bytes must be above min_bytes")
        if self.max_channels < self.min_channels:
            raise ValueError("max_channels must be at least min_channels")
        for name in ("collectives", "algorithms", "protocols"):
            values = getattr(self, name)
            if len(set(values)) != len(values):
                raise ValueError(f"{name} lists a value twice")


Port = Annotated[int, Num(1, 65535)]
Dscp = Annotated[int, Num(0, 63)]


@dataclass(frozen=True)
class BulkTraffic:
    """A job's bulk traffic (checkpoints, data loading) and the bandwidth it always keeps."""

    #: Megabits per second per host the bulk class keeps on a congested link.
    floor_mbps: Annotated[float, Num(0.0, 10_000_000.0)] = 0.0
    #: Remote TCP ports of bulk transfers (object store, NFS, ...).
    ports: Annotated[tuple[Port, ...], Len(32)] = ()
    #: DSCP values the job marks its bulk traffic with.
    dscp: Annotated[tuple[Dscp, ...], Len(64)] = ()


@dataclass(frozen=True)
class EnergyAllowance:
    """How much slower a job may run so that its GPUs use less energy (the provider
    lowers their power limits within it, and backs off before the job slows that much)."""

    #: The slowdown the job accepts, as a share of its progress (0.05: at most 5% fewer
    #: collectives per second than at the GPUs' own limits); 0: none, nothing is changed.
    max_slowdown: Annotated[float, Num(0.0, 0.5)] = 0.0
    #: The lowest power limit any of the job's GPUs may get, in watts; 0: the provider's
    #: own bounds alone.
    min_watts: Annotated[float, Num(0.0, 100_000.0)] = 0.0


@message("job-declaration", Category.CONTROL)
@dataclass(frozen=True)
class JobDeclaration(Message):
    """What a tenant allows the provider to do to one job, declared ahead of time.

    Tenants send it to the controller, which checks that the job is theirs and
    forwards it to the agents hosting the job; an operator may set one on a
    single host with ``harmonctl declare``.
    """

    #: Your job, as your scheduler named it when it placed it.
    job: Ident
    #: Seconds a member of the job may pause for hardware validation; 0: never.
    max_validation_pause: Annotated[float, Num(0.0, 86400.0)] = 0.0
    #: Ranges the provider may retune NCCL within; none: NCCL's own choices.
    tuning: Annotated[tuple[TuningRange, ...], Len(32)] = ()
    #: Your bulk traffic and the bandwidth it keeps on a congested link; none: no classes.
    bulk: BulkTraffic | None = None
    #: Increases with each new declaration of the job (the newest wins).
    revision: Count = 0
    #: The job ended or the tenant withdrew it: undo everything done for it.
    withdrawn: bool = False
    #: The Unix group of the job's processes on the receiving host, from the
    #: provider's placement (never from the tenant): only its members may read
    #: and follow the job's tuner policy there. Empty: root's processes only.
    group: Name = ""
    #: Seconds by which the tenant may defer each validation notice, once; 0: never.
    max_validation_defer: Annotated[float, Num(0.0, 86400.0)] = 0.0
    #: The slowdown the job accepts for energy (GPU power limits); none: never.
    energy: EnergyAllowance | None = None


@dataclass(frozen=True)
class Activation:
    #: NCCL's communicator id, low 62 bits (the same on every rank).
    comm: Count
    #: The collective index from which the change applies on that communicator.
    at: Count


@message("tuning-arm", Category.CONTROL)
@dataclass(frozen=True)
class TuningArm(Message):
    """Phase one of a multi-host change: every host arms it, none applies it yet.

    ``choice`` names one of the rulesets every host derives alike from the
    job's declaration (``fingerprint`` says which rules); each host writes the
    change as *pending* from ``at`` per communicator and answers with a
    :class:`TuningAck`. Its ranks that reach ``at`` before the outcome wait.
    """

    job: Ident
    decision: Count
    choice: Ident
    fingerprint: Name
    activations: Annotated[tuple[Activation, ...], Len(32, min_len=1)]


@message("tuning-resolve", Category.CONTROL)
@dataclass(frozen=True)
class TuningResolve(Message):
    """Phase two: the armed change is confirmed (``commit``) or cancelled, alike
    on every host. Resent until each host acknowledged it."""

    job: Ident
    decision: Count
    commit: bool
    activations: Annotated[tuple[Activation, ...], Len(32)] = ()


@message("validation-decision", Category.CONTROL)
@dataclass(frozen=True)
class ValidationDecision(Message):
    """A tenant's answer to a validation notice, for the host that planned it:
    ``notice`` is the host's own id of the plan. ``approve`` lets it start now (once
    every job on the device has approved); ``defer`` pushes its start back by that
    many seconds (once per job, within the job's declared ``max_validation_defer``,
    which the host checks again)."""

    notice: Ident
    job: Ident
    approve: bool = False
    defer: Seconds = 0.0


CONTROLLER_KINDS = frozenset({"ack", "resync", "job-declaration", "tuning-arm",
                              "tuning-resolve", "validation-decision"})

# --- controller -> tenant feed -------------------------------------------------------


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


# --- tenant <-> controller ------------------------------------------------------------

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


class NoticeAction(StrEnum):
    APPROVE = "approve"  # start now: the job is ready (checkpointed, drained)
    DEFER = "defer"      # start later, by up to the declared max_validation_defer


@message("validation-answer", Category.CONTROL)
@dataclass(frozen=True)
class ValidationAnswer(Message):
    """A tenant's answer to one of its validation notices (by the notice's ``id``)."""

    #: The notice's ``id``.
    notice: Ident
    action: NoticeAction
    #: For ``defer``: seconds to defer by; 0 asks for all the declaration allows.
    seconds: Seconds = 0.0


TENANT_KINDS = frozenset({"subscribe", "job-declaration", "validation-answer"})
FEED_KINDS = frozenset({"pool-capacity", "job-advisory", "job-health", "validation-notice",
                        "subscribed", "reply"})
_TENANT_FACING = FEED_KINDS | TENANT_KINDS

# --- envelope and codec --------------------------------------------------------------


@dataclass(frozen=True)
class Envelope:
    kind: str
    sender: str
    seq: int
    time: float
    body: Message

    @property
    def category(self) -> Category:
        return self.body.CATEGORY


#: Called with (kind, sender, plain body) for every tenant-facing message this process
#: encodes, where auditing is on (harmonaize/wireaudit.py installs it); None: off.
audit_hook: Callable[[str, str, object], None] | None = None


def auditing() -> bool:
    return audit_hook is not None


def audit(kind: str, sender: str, plain: object) -> None:
    """Record one tenant-facing message (a wire body, or a CloudEvent as ``cloudevent``)."""
    if audit_hook is not None:
        audit_hook(kind, sender, plain)


def encode(body: Message, *, sender: str, seq: int = 0, now: float | None = None) -> bytes:
    """Serialise ``body`` in a versioned envelope."""
    stamp = time.time() if now is None else now
    plain = to_plain(body)
    frame = [MAGIC, VERSION, body.KIND, sender, seq, stamp, plain]
    data = msgpack.packb(frame, use_bin_type=True)
    if len(data) > MAX_FRAME:
        raise WireError(f"{body.KIND}: frame of {len(data)} bytes exceeds {MAX_FRAME}")
    if audit_hook is not None and body.KIND in _TENANT_FACING:
        audit_hook(body.KIND, sender, plain)
    return data


@dataclass(frozen=True)
class _Header:
    sender: Ident
    seq: Count
    time: Timestamp


def decode(data: bytes, *, allowed: Collection[str] | None = None,
           strict: bool = False) -> Envelope:
    """Parse an untrusted frame. Raises only :class:`WireError`.

    With ``strict``, unknown fields anywhere in the body are errors (requests
    from tenants: a misspelt field must not be acknowledged as if it applied).
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise WireError("frame must be bytes")
    if len(data) > MAX_FRAME:
        raise WireError(f"frame of {len(data)} bytes exceeds {MAX_FRAME}")
    if len(data) == 0:
        raise WireError("empty frame")
    try:
        frame = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=True,
            max_str_len=MAX_STR,
            max_bin_len=0,
            max_array_len=MAX_LIST,
            max_map_len=MAX_MAP,
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError) as exc:  # every msgpack error
        raise WireError(f"not a valid msgpack frame: {exc}") from None
    if not isinstance(frame, list) or len(frame) != 7:
        raise WireError("frame is not a 7-element envelope")
    magic, version, kind, sender, seq, stamp, body = frame
    if magic != MAGIC:
        raise WireError("bad magic: not a HarmonAIze frame")
    if version != VERSION or isinstance(version, bool):
        raise WireError(f"unsupported wire version {version!r:.20} (this side speaks {VERSION})")
    try:
        header = from_plain(_Header, {"sender": sender, "seq": seq, "time": stamp}, "envelope")
    except SchemaError as exc:
        raise WireError(str(exc)) from None
    # The envelope is read: from here a refusal names the request's number (an unknown
    # kind too, so a client's "the answer to my request n" holds).
    if not isinstance(kind, str) or kind not in _REGISTRY:
        raise WireError.of_request(f"unknown message kind {kind!r:.60}", header.seq)
    if allowed is not None and kind not in allowed:
        raise WireError.of_request(f"message kind {kind!r} is not accepted here", header.seq)
    try:
        if strict:
            with strict_keys():
                message_body = from_plain(_REGISTRY[kind], body, kind)
        else:
            message_body = from_plain(_REGISTRY[kind], body, kind)
    except SchemaError as exc:
        raise WireError.of_request(str(exc), header.seq) from None
    return Envelope(kind, header.sender, header.seq, header.time, message_body)
