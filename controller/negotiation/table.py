"""A negotiation's states and moves, in one table (harmonaize/statemachine.py).

A proposal is answered in the step it arrives: an offer, a counter or a refusal. An
offer or counter is accepted (a hold), rejected, countered by the tenant (a new round:
back to ``proposed``) or expires. A hold starts (the scheduler placed its job), is
released by the tenant, cancelled by an operator, or expires unused (a no-show).

Every state has an expiry: the open ones by the table's ``expire`` move, at the offer's
expiry or the hold's start grace; the final ones are kept for replays for a while, then
forgotten (their request id refused as closed for a while longer; see the engine).
"""

from __future__ import annotations

from enum import StrEnum

from controller.negotiation.types import State
from harmonaize.statemachine import Machine


class Event(StrEnum):
    OFFER = "offer"
    COUNTER = "counter"
    REFUSE = "refuse"
    ACCEPT = "accept"
    REJECT = "reject"
    TENANT_COUNTER = "tenant-counter"
    START = "start"
    RELEASE = "release"
    CANCEL = "cancel"
    EXPIRE = "expire"


NEGOTIATION: Machine[State, Event] = Machine("negotiation", {
    (State.PROPOSED, Event.OFFER): State.OFFERED,
    (State.PROPOSED, Event.COUNTER): State.COUNTERED,
    (State.PROPOSED, Event.REFUSE): State.REFUSED,
    (State.PROPOSED, Event.EXPIRE): State.EXPIRED,
    (State.OFFERED, Event.ACCEPT): State.HELD,
    (State.OFFERED, Event.REJECT): State.REJECTED,
    (State.OFFERED, Event.TENANT_COUNTER): State.PROPOSED,
    (State.OFFERED, Event.EXPIRE): State.EXPIRED,
    (State.COUNTERED, Event.ACCEPT): State.HELD,
    (State.COUNTERED, Event.REJECT): State.REJECTED,
    (State.COUNTERED, Event.TENANT_COUNTER): State.PROPOSED,
    (State.COUNTERED, Event.EXPIRE): State.EXPIRED,
    (State.HELD, Event.START): State.STARTED,
    (State.HELD, Event.RELEASE): State.RELEASED,
    (State.HELD, Event.CANCEL): State.CANCELLED,
    (State.HELD, Event.EXPIRE): State.EXPIRED,
}, states=tuple(State), events=tuple(Event))

#: States a tenant is still negotiating in (they count against its bound on open ones).
OPEN = frozenset({State.PROPOSED, State.OFFERED, State.COUNTERED, State.HELD})
#: States that answer an offer id (accept, reject, counter).
ANSWERABLE = frozenset({State.OFFERED, State.COUNTERED})
#: States no move leaves: kept for replays, then forgotten.
FINAL = frozenset(State) - OPEN

#: How long an offer stands unless the policy says otherwise (seconds).
OFFER_TTL = 120.0
#: Rounds per negotiation: the first proposal and up to three counters of the tenant.
MAX_ROUNDS = 4
#: Open negotiations (and holds) per tenant: the flood bound.
MAX_OPEN = 16
#: A hold not started this long after its window's start is a no-show (at most the
#: window's own length).
START_GRACE = 900.0
#: A hold released at least this long before its start costs nothing; later, or a
#: no-show, charges its GPU-seconds.
FREE_RELEASE = 3600.0
#: A final state answers replays this long, then its id is refused as closed ...
RETAIN = 3600.0
#: ... for this long more (a day: longer than any client's retry).
TOMBSTONE = 86400.0
#: Final records and closed ids kept per tenant at most (the oldest go first).
MAX_RETAINED = 64
MAX_TOMBSTONES = 1024
#: The longest window, and how far ahead a window may start.
MAX_DURATION = 7 * 86400.0
MAX_HORIZON = 30 * 86400.0
#: How far past its latest start a time counter may go.
COUNTER_HORIZON = 86400.0
