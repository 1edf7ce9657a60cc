"""What passes between the controller's sans-I/O core and its shell.

Inputs name where a decoded message came from (:class:`AgentPeer`,
:class:`TenantPeer`) or say that a frame could not be decoded
(:class:`BadFrame`). Outputs are plain values the shell executes in the order
given; a :class:`Commit` is stored (one transaction) before anything after it
is sent, which is how the core keeps its promise that nothing acknowledged is
lost: every acknowledgement, publication and answer that depends on new state
comes after the ``Commit`` holding that state.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from harmonaize.messages import JobDeclaration, JobProgress, Message

if TYPE_CHECKING:
    from controller.cluster import HostRecord, StoredEvent
    from controller.notices import Notice
    from controller.types import Placement

# --- inputs ----------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentPeer:
    """An agent's connection: its routing id, and the host its CurveZMQ key names
    (None without authentication: then the message's sender is taken at its word)."""

    conn: bytes
    host: str | None = None


@dataclass(frozen=True)
class TenantPeer:
    """A tenant's connection: its routing id, and the tenant its key names ("" without
    authentication: pool topics only)."""

    peer: bytes
    tenant: str = ""
    #: The request already spent its tenant's request budget at the door (the shell's
    #: or the gateway's, before it was decoded), so the core does not spend it again.
    admitted: bool = False


Peer = AgentPeer | TenantPeer


@dataclass(frozen=True)
class BadFrame:
    """A frame the shell could not decode: ``reason`` is ``framing`` (not one routing id
    and one message) or ``invalid`` (the wire format refused it)."""

    reason: str
    detail: str
    #: The request's sequence number when its envelope was readable (0: it was not).
    seq: int = 0
    #: Whether its envelope could be read (a request number known, 0 included): then
    #: the body was wrong and the answer is ``invalid``; else ``malformed``.
    readable: bool = True


# --- what the shell stores -------------------------------------------------------------


class FeedEntry(NamedTuple):
    """One numbered publication as the feed log keeps it: its topic's sequence number,
    and its place in its stream (controller/feed.py:stream_of)."""

    topic: str
    seq: int
    condition: bool
    frame: bytes
    stream: str = ""
    offset: int = 0


@dataclass(frozen=True)
class Writes:
    """State changed since the last commit, to be stored in one transaction."""

    #: Hosts as they are now (copies: later changes are the next commit's).
    hosts: tuple[HostRecord, ...] = ()
    events: tuple[StoredEvent, ...] = ()
    #: Each topic's newest sequence number.
    feed_seqs: Mapping[str, int] = field(default_factory=dict)
    feed_log: tuple[FeedEntry, ...] = ()
    #: Each stream's newest offset.
    feed_offsets: Mapping[str, int] = field(default_factory=dict)
    #: By job: (tenant, declaration), or None where it went.
    declarations: Mapping[str, tuple[str, JobDeclaration] | None] = field(default_factory=dict)
    #: By job: its placement, or None where it went.
    placements: Mapping[str, Placement | None] = field(default_factory=dict)
    #: By job: the agreement's snapshot, or None where it went.
    tuning: Mapping[str, Mapping[str, Any] | None] = field(default_factory=dict)
    #: By notice id: what the tenant was told and answered, or None where it went.
    notices: Mapping[str, Notice | None] = field(default_factory=dict)
    #: The negotiation engine's rows that changed (controller/negotiationrows.py), a
    #: row None where it went; None: nothing changed.
    negotiation: Mapping[str, Any] | None = None

    def __bool__(self) -> bool:
        return bool(self.hosts or self.events or self.feed_seqs or self.feed_log
                    or self.declarations or self.placements or self.tuning or self.notices
                    or self.negotiation is not None)


@dataclass(frozen=True)
class Restored:
    """What the store gives back after a restart (a new core begins from it)."""

    hosts: tuple[HostRecord, ...] = ()
    tuning: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    placements: tuple[Placement, ...] = ()
    feed_seqs: Mapping[str, int] = field(default_factory=dict)
    #: Each topic's newest condition: (seq, frame, offset in its stream).
    latest: Mapping[str, tuple[int, bytes, int]] = field(default_factory=dict)
    declarations: tuple[tuple[str, JobDeclaration], ...] = ()
    #: The database's feed epoch (a database begun anew has another one).
    feed_epoch: int = 0
    notices: tuple[Notice, ...] = ()
    #: Each stream's newest offset.
    feed_offsets: Mapping[str, int] = field(default_factory=dict)
    #: Jobs' progress findings their owners were last told were active, with the
    #: owner (from the retained feed log): a restarted core withdraws those no longer so.
    progress: tuple[tuple[str, JobProgress], ...] = ()
    #: The negotiation engine's rows as last committed (None: none kept).
    negotiation: Mapping[str, Any] | None = None


# --- outputs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Commit:
    """Store ``writes`` in one transaction before executing any later output."""

    writes: Writes


@dataclass(frozen=True)
class SendToAgent:
    conn: bytes
    message: Message


@dataclass(frozen=True)
class SendToTenant:
    """A numbered publication, the frame as stored, for one subscriber on ``topic``.
    The shell reports how it went with :meth:`ControllerCore.delivered`."""

    peer: bytes
    topic: str
    frame: bytes
    #: Its place in its stream; 0 when sent again (a republication, the present for a
    #: late joiner), which a stream with a cursor already has or was given otherwise.
    offset: int = 0


@dataclass(frozen=True)
class FanOut:
    """One publication for every subscriber of ``topic`` (``peers``: the hub's list, read
    only), already counted as sent to each: the shell sends it in one loop and reports
    only the peers it found full or gone, with :meth:`ControllerCore.fanned`."""

    peers: Sequence[bytes]
    topic: str
    frame: bytes
    #: As :attr:`SendToTenant.offset`.
    offset: int = 0

    def sends(self) -> list[SendToTenant]:
        return [SendToTenant(peer, self.topic, self.frame, self.offset) for peer in self.peers]


def tenant_sends(outputs: Iterable[object]) -> list[SendToTenant]:
    """Each publication the outputs send, one per subscriber, in order (a fan-out's
    for each of its peers)."""
    found: list[SendToTenant] = []
    for out in outputs:
        if isinstance(out, SendToTenant):
            found.append(out)
        elif isinstance(out, FanOut):
            found += out.sends()
    return found


@dataclass(frozen=True)
class AnswerTenant:
    """An answer to a tenant's request (unnumbered, on no topic); reported like a
    :class:`SendToTenant`."""

    peer: bytes
    message: Message


@dataclass(frozen=True)
class Replay:
    """Send ``peer`` up to ``limit`` stored frames of ``topic`` after ``after``, none
    numbered below ``retained_from``, each as a :class:`SendToTenant`."""

    peer: bytes
    topic: str
    after: int
    limit: int
    retained_from: int


@dataclass(frozen=True)
class Prune:
    """Prune old host events, and the feed log to ``retention`` messages per topic."""

    retention: int


Output = Commit | SendToAgent | SendToTenant | FanOut | AnswerTenant | Replay | Prune


class Delivery(Enum):
    """How sending to a tenant went: a full queue loses the message, a gone peer is
    dropped from the subscribers (it renews when it comes back)."""

    SENT = "sent"
    FULL = "full"
    GONE = "gone"
