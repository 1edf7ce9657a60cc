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

This package is the public import path (``from harmonaize.messages import X``); it
re-exports every name of its modules, one per family, so callers need not know where a
message lives: ``core`` (version, limits, registry), ``values`` (shared value types),
``host`` (a host's connection and summary), ``energy``, ``tuning``, ``declaration``,
``validation`` (notices and answers), ``negotiation`` (reservations and maintenance
windows in rounds), ``jobhealth`` (ranks' progress, hangs, a job's
own XIDs), ``feed`` (the tenant's feed and requests),
``peers`` (which kinds each peer may send) and ``codec`` (envelope, encode, decode,
audit). The audit hook is set on ``codec`` itself (``harmonaize/wireaudit.py``).
"""

from __future__ import annotations

from harmonaize.messages.codec import Envelope, audit, auditing, check_head, decode, encode
from harmonaize.messages.core import (
    MAGIC,
    MAX_FRAME,
    MAX_LIST,
    MAX_MAP,
    MAX_STR,
    VERSION,
    Category,
    Message,
    WireError,
    kinds,
    message,
    registered,
)
from harmonaize.messages.declaration import BulkTraffic, Dscp, JobDeclaration, Port
from harmonaize.messages.energy import EnergyAllowance, JobEnergy
from harmonaize.messages.feed import (
    ERROR_MEANINGS,
    Advice,
    ErrorCode,
    JobAdvisory,
    JobHealth,
    PoolCapacity,
    Position,
    Refusal,
    Reply,
    Subscribe,
    Subscribed,
    Topic,
    TuningStatus,
    Urgency,
)
from harmonaize.messages.host import (
    Ack,
    Goodbye,
    GpuCounts,
    Heartbeat,
    Hello,
    Hold,
    HoldKind,
    HostEvent,
    HostSummary,
    Resync,
)
from harmonaize.messages.jobhealth import (
    ApplicationXid,
    Cause,
    CommProgress,
    Fault,
    Finding,
    JobProgress,
    JobRankProgress,
    ProcessState,
    ProgressState,
    RankProgress,
)
from harmonaize.messages.negotiation import (
    Flexible,
    MaintenanceCounter,
    Negotiated,
    NegotiationAccept,
    NegotiationCounter,
    NegotiationExpired,
    NegotiationList,
    NegotiationPropose,
    NegotiationReject,
    NegotiationRelease,
    Outcome,
)
from harmonaize.messages.peers import (
    AGENT_KINDS,
    CONTROLLER_KINDS,
    FEED_KINDS,
    TENANT_FACING,
    TENANT_KINDS,
)
from harmonaize.messages.tuning import (
    AckPhase,
    Activation,
    Algorithm,
    Bytes,
    Channels,
    Collective,
    CommReport,
    Protocol,
    SwitchState,
    TuningAck,
    TuningArm,
    TuningRange,
    TuningReport,
    TuningResolve,
)
from harmonaize.messages.validation import (
    NoticeAction,
    NoticeStatus,
    ValidationAnswer,
    ValidationCause,
    ValidationDecision,
    ValidationNotice,
)
from harmonaize.messages.values import (
    Bucket,
    Condition,
    Conditions,
    Health,
    Level,
    LinkHealth,
    Severity,
    Status,
    Trend,
)

#: Every public name of the families, as before the split into modules.
__all__ = [
    "AGENT_KINDS", "CONTROLLER_KINDS", "ERROR_MEANINGS", "FEED_KINDS", "MAGIC", "MAX_FRAME",
    "MAX_LIST", "MAX_MAP", "MAX_STR", "TENANT_FACING", "TENANT_KINDS", "VERSION", "Ack",
    "AckPhase", "Activation", "Advice", "Algorithm", "ApplicationXid", "Bucket", "BulkTraffic",
    "Bytes", "Category", "Cause", "Channels", "Collective", "CommProgress", "CommReport",
    "Condition", "Conditions", "Dscp", "EnergyAllowance", "Envelope", "ErrorCode", "Fault",
    "Finding", "Flexible", "Goodbye", "GpuCounts", "Health", "Heartbeat", "Hello", "Hold",
    "HoldKind", "HostEvent", "HostSummary", "JobAdvisory", "JobDeclaration", "JobEnergy",
    "JobHealth", "JobProgress", "JobRankProgress", "Level", "LinkHealth", "MaintenanceCounter",
    "Message", "Negotiated", "NegotiationAccept", "NegotiationCounter", "NegotiationExpired",
    "NegotiationList", "NegotiationPropose", "NegotiationReject", "NegotiationRelease",
    "NoticeAction", "NoticeStatus", "Outcome", "PoolCapacity", "Port", "Position", "ProcessState",
    "ProgressState", "Protocol", "RankProgress", "Refusal", "Reply", "Resync", "Severity",
    "Status", "Subscribe", "Subscribed", "SwitchState", "Topic", "Trend", "TuningAck",
    "TuningArm", "TuningRange", "TuningReport", "TuningResolve", "TuningStatus", "Urgency",
    "ValidationAnswer", "ValidationCause", "ValidationDecision", "ValidationNotice",
    "WireError", "audit", "auditing", "check_head", "decode", "encode", "kinds", "message",
    "registered",
]
