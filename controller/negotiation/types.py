"""What negotiations say: tenants' proposals and answers in, the controller's offers,
counters, refusals and holds out (no I/O, no clock; docs/tenant-guide.md, "Negotiating
capacity and maintenance").

Times are seconds on the controller's clock, passed in; counts are GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Flexibility(StrEnum):
    """What the tenant lets the controller counter with when its proposal cannot be met."""

    NONE = "none"    # the proposal as it stands, or a refusal
    COUNT = "count"  # fewer GPUs than its minimum, in its window
    TIME = "time"    # its count, starting after its latest start
    ANY = "any"      # either


class State(StrEnum):
    """A negotiation's state (the table: controller/negotiation/table.py)."""

    PROPOSED = "proposed"
    OFFERED = "offered"
    COUNTERED = "countered"
    REFUSED = "refused"
    HELD = "held"
    REJECTED = "rejected"
    EXPIRED = "expired"
    STARTED = "started"
    RELEASED = "released"
    CANCELLED = "cancelled"


class Reason(StrEnum):
    """A refusal's coarse reason: never a count, a host or another tenant."""

    NO_CAPACITY = "no-capacity"          # the tenant's share of the released view is spent
    ROUNDS = "rounds-exhausted"          # the negotiation had its rounds
    CANCELLED = "cancelled-by-operator"  # an operator cancelled the hold


@dataclass(frozen=True)
class Proposal:
    """A tenant's request for GPUs of one class in one pool, for one window."""

    request_id: str
    tenant: str
    pool: str
    gpu_class: str
    min_count: int
    max_count: int
    #: The window may start at the earliest here ...
    earliest_start: float
    #: ... and at the latest here.
    latest_start: float
    #: How long it lasts once started.
    duration: float
    flexibility: Flexibility = Flexibility.NONE


# --- inputs ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Propose:
    proposal: Proposal


@dataclass(frozen=True)
class Accept:
    tenant: str
    request_id: str
    offer_id: str


@dataclass(frozen=True)
class Reject:
    tenant: str
    request_id: str
    offer_id: str


@dataclass(frozen=True)
class CounterProposal:
    """The tenant's counter to an offer: a new proposal under the same request id."""

    offer_id: str
    proposal: Proposal


@dataclass(frozen=True)
class Release:
    """The tenant gives a hold back (free long enough before its start; charged after)."""

    tenant: str
    request_id: str


@dataclass(frozen=True)
class CapacityRelease:
    """What the private feed released for one pool: the lower edge of its free GPUs (the
    cautious reading) and the most it could hold, at the release's time."""

    pool: str
    gpu_class: str
    free: int
    ceiling: int
    at: float


@dataclass(frozen=True)
class Started:
    """The scheduler placed the hold's job: the hold is used."""

    tenant: str
    request_id: str


@dataclass(frozen=True)
class Cancel:
    """An operator cancels a hold (``harmonctl -C holds cancel``): nothing is charged."""

    tenant: str
    request_id: str


# --- outputs --------------------------------------------------------------------------

@dataclass(frozen=True)
class Offer:
    """GPUs the controller will hold for the tenant if it accepts before ``expires_at``."""

    offer_id: str
    request_id: str
    tenant: str
    count: int
    start: float
    end: float
    expires_at: float
    round: int


@dataclass(frozen=True)
class Counter(Offer):
    """An offer outside the proposal's bounds (fewer GPUs, or a later start), made only
    where its flexibility allows; accepted like an offer."""

    departs: str = "count"


@dataclass(frozen=True)
class Refusal:
    request_id: str
    tenant: str
    reason: Reason


@dataclass(frozen=True)
class Hold:
    """An accepted offer: kept out of every other tenant's share until it starts, is
    released, or expires unused at ``expires_at`` (a no-show)."""

    request_id: str
    tenant: str
    pool: str
    gpu_class: str
    count: int
    start: float
    end: float
    expires_at: float


@dataclass(frozen=True)
class Closed:
    """A negotiation or hold ended (rejected, expired, released, cancelled, started), and
    the GPU-seconds it charged against the tenant's priority."""

    request_id: str
    tenant: str
    state: State
    charged: float = 0.0


@dataclass(frozen=True)
class Error:
    """Bad input, refused with nothing changed: the field and one line on why."""

    tenant: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


class BadInput(ValueError):
    """Raised by the checks (controller/negotiation/checks.py); the engine answers it as
    an :class:`Error`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
