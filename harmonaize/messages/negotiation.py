"""Negotiation on the wire: a tenant's proposals and answers for capacity reservations,
its counter to a maintenance window, and the controller's answer to each, carried in the
request's :class:`~harmonaize.messages.Reply` (``negotiation``), so every door (ZeroMQ,
HTTP, a cluster replica forwarding to its leader) answers them as it answers any request.

Times are Unix seconds on the controller's clock; counts are GPUs. The controller's rules
(docs/tenant-guide.md, "Negotiating capacity and maintenance") check every field again and
name the one at fault; the bounds here only keep frames small.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated

from harmonaize.messages.core import Category, Message, message
from harmonaize.schema import Count, Ident, Len, Name, Num, Timestamp

#: A GPU count as a tenant may write it (the controller says 1 at least, and below what).
_Gpus = Annotated[int, Num(0, 1_000_000)]
#: How long a window lasts (the controller says at most 7 days).
_Duration = Annotated[float, Num(0.0, 1e9)]


class Flexible(StrEnum):
    """What the controller may counter with when a proposal cannot be met as it stands."""

    NONE = "none"    # the proposal as it stands, or a refusal
    COUNT = "count"  # fewer GPUs than the minimum, in the proposal's window
    TIME = "time"    # the count, starting after the latest start
    ANY = "any"      # either


@message("negotiation-propose", Category.CONTROL)
@dataclass(frozen=True)
class NegotiationPropose(Message):
    """Ask for GPUs of one class in one pool, for one window (a reservation's first round).
    Send it again under the same ``request_id`` to get the same answer (a retry)."""

    #: Yours to choose: names the negotiation in every later request (1-64 of A-Z a-z 0-9
    #: . _ : -).
    request_id: Ident
    pool: Ident
    gpu_class: Ident
    min_count: _Gpus
    max_count: _Gpus
    #: The window may start at the earliest here ...
    earliest_start: Timestamp
    #: ... and at the latest here.
    latest_start: Timestamp
    #: Seconds it lasts once started.
    duration: _Duration
    flexibility: Flexible = Flexible.NONE


@message("negotiation-counter", Category.CONTROL)
@dataclass(frozen=True)
class NegotiationCounter(Message):
    """Answer an offer (or counter) with a new proposal under the same ``request_id``: the
    next round."""

    request_id: Ident
    #: The offer countered.
    offer_id: Ident
    pool: Ident
    gpu_class: Ident
    min_count: _Gpus
    max_count: _Gpus
    earliest_start: Timestamp
    latest_start: Timestamp
    duration: _Duration
    flexibility: Flexible = Flexible.NONE


@message("negotiation-accept", Category.CONTROL)
@dataclass(frozen=True)
class NegotiationAccept(Message):
    """Accept an offer (or counter) before it expires: it becomes a hold."""

    request_id: Ident
    offer_id: Ident


@message("negotiation-reject", Category.CONTROL)
@dataclass(frozen=True)
class NegotiationReject(Message):
    """Reject an offer (or counter): the negotiation ends."""

    request_id: Ident
    offer_id: Ident


@message("negotiation-release", Category.CONTROL)
@dataclass(frozen=True)
class NegotiationRelease(Message):
    """Give a hold back (free up to an hour before its start, charged to your record
    later)."""

    request_id: Ident


@message("maintenance-counter", Category.CONTROL)
@dataclass(frozen=True)
class MaintenanceCounter(Message):
    """Answer a validation notice's window: no ``windows`` accepts the provider's; else up
    to four starts (your checkpoints), of which the provider takes the earliest its
    condition's bound allows, or keeps its own."""

    #: The notice's ``id``.
    notice: Ident
    windows: Annotated[tuple[Timestamp, ...], Len(16)] = ()


class Outcome(StrEnum):
    """What the controller's answer to a negotiation request is."""

    OFFER = "offer"        # GPUs it will hold if you accept before expires_at
    COUNTER = "counter"    # an offer outside your bounds (departs says how)
    REFUSAL = "refusal"    # nothing to offer (reason says why, coarsely)
    HOLD = "hold"          # an accepted offer, held until it starts, is released or expires
    CLOSED = "closed"      # the negotiation ended (state says how; charged: its cost)
    WINDOW = "window"      # a maintenance window as it stands (state says how)


@dataclass(frozen=True)
class Negotiated:
    """The controller's answer to a negotiation request, in one shape for every outcome
    (fields that do not apply are left at their zero values)."""

    outcome: Outcome
    #: The negotiation's request id (a maintenance window: the notice's id).
    request_id: Ident
    #: The offer's id, to accept, reject or counter it with (offer, counter).
    offer_id: Name = ""
    #: GPUs offered or held.
    count: Count = 0
    #: The window offered or held (a maintenance window: when it starts and its end).
    start: Timestamp = 0.0
    end: Timestamp = 0.0
    #: An offer must be accepted by then; a hold not started by then is a no-show.
    expires_at: Timestamp = 0.0
    round: Count = 0
    #: A counter's departure from the proposal: ``count`` or ``time``.
    departs: Name = ""
    #: A refusal's coarse reason: ``no-capacity``, ``rounds-exhausted``.
    reason: Name = ""
    #: A closed negotiation's or a maintenance window's state.
    state: Name = ""
    #: GPU-seconds a closed hold charged to your record (a no-show, a late release).
    charged: Annotated[float, Num(0.0, 1e15)] = 0.0


@message("negotiation-list", Category.CONTROL)
@dataclass(frozen=True)
class NegotiationList(Message):
    """Ask for your negotiations, holds and maintenance windows as they stand (the
    answer's ``negotiation`` lists them)."""


@message("negotiation-expired", Category.EVENT)
@dataclass(frozen=True)
class NegotiationExpired(Message):
    """One of your negotiations ran out, published on ``job/<you>/@negotiation/``: an
    offer you did not accept in time (its GPUs are back in what can be offered), or a
    hold no placement named by its no-show time (charged to your record)."""

    request_id: Ident
    #: ``offer`` (an offer or a counter lapsed) or ``hold`` (a no-show).
    expired: Name
    #: When it expired (Unix time).
    at: Timestamp
    #: GPU-seconds charged to your record (a hold's no-show).
    charged: Annotated[float, Num(0.0, 1e15)] = 0.0
