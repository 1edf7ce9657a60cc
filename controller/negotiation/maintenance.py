"""Maintenance windows in rounds: a validation notice's window, the tenant's counter with
windows at its checkpoints, and the provider's settlement within the urgency of the
condition behind it (no I/O, no clock).

The provider proposes a window (aligned to the job's checkpoints where its declaration
gives their cadence); the tenant accepts it or counters once with up to
:data:`MAX_WINDOWS` starts; the provider agrees to the earliest that falls within the
condition's bound (:data:`URGENCY`) and after its least notice, or keeps its own window
(overrides, with the notice it already gave). A tenant silent until the least notice
before the window lets it stand. One counter per notice: the rounds are bounded at two.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum

from controller.negotiation.checks import check_id
from controller.negotiation.types import BadInput
from harmonaize.maintenancetables import HOUR, URGENCY, Urgency
from harmonaize.maintenancetables import ValidationCause as Cause
from harmonaize.statemachine import Machine

__all__ = ["HOUR", "MAX_WINDOWS", "RETAIN", "URGENCY", "Cause", "MState", "MaintenanceAnswer",
           "MaintenanceBook", "MaintenanceProposal", "MaintenanceWindow", "Urgency",
           "checkpoint_starts"]


#: Counter windows per answer.
MAX_WINDOWS = 4
#: A settled window is remembered for retries this long after it ends.
RETAIN = 3600.0


class MState(StrEnum):
    PROPOSED = "proposed"      # the provider's window, awaiting the tenant
    AGREED = "agreed"          # the tenant's acceptance, or its counter within the bound
    OVERRIDDEN = "overridden"  # no counter window within the bound: the provider's stands
    STOOD = "stood"            # the tenant was silent: the provider's stands


class MEvent(StrEnum):
    ACCEPT = "accept"
    FIT = "fit"
    OVERRIDE = "override"
    EXPIRE = "expire"


MAINTENANCE: Machine[MState, MEvent] = Machine("maintenance", {
    (MState.PROPOSED, MEvent.ACCEPT): MState.AGREED,
    (MState.PROPOSED, MEvent.FIT): MState.AGREED,
    (MState.PROPOSED, MEvent.OVERRIDE): MState.OVERRIDDEN,
    (MState.PROPOSED, MEvent.EXPIRE): MState.STOOD,
}, states=tuple(MState), events=tuple(MEvent))


@dataclass(frozen=True)
class MaintenanceProposal:
    """The provider's side: a validation notice's window for one job."""

    notice_id: str
    tenant: str
    job: str
    cause: Cause
    start: float
    pause: float
    issued_at: float
    #: From the job's declaration: how often it checkpoints (0: unknown), and when last.
    checkpoint_every: float = 0.0
    last_checkpoint: float | None = None


@dataclass(frozen=True)
class MaintenanceAnswer:
    """The tenant's side: no windows accepts the provider's; else its counter."""

    tenant: str
    notice_id: str
    windows: tuple[float, ...] = ()


@dataclass(frozen=True)
class MaintenanceWindow:
    """The window as it stands, to the tenant: proposed, or settled and how."""

    notice_id: str
    tenant: str
    job: str
    start: float
    pause: float
    state: MState
    #: The latest the condition allows (the tenant's counters must start by then).
    latest: float


def _finite(value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def checkpoint_starts(last: float, every: float, after: float, before: float,
                      limit: int = MAX_WINDOWS) -> tuple[float, ...]:
    """Checkpoint instants ``last + k * every`` in ``[after, before]``, the first
    ``limit`` of them: where a pause loses no work."""
    if every <= 0 or not math.isfinite(every) or before < after:
        return ()
    k = max(0, math.ceil((after - last) / every))
    out = []
    while len(out) < limit and (t := last + k * every) <= before:
        out.append(t)
        k += 1
    return tuple(out)


@dataclass
class Item:
    proposal: MaintenanceProposal
    state: MState
    window: MaintenanceWindow
    until: float
    answer: MaintenanceAnswer | None = None


@dataclass
class MaintenanceBook:
    items: dict[str, Item] = field(default_factory=dict)
    #: The bounds per condition (the operator's [negotiation] may shorten the table's).
    urgency: dict[Cause, Urgency] = field(default_factory=lambda: dict(URGENCY))

    def next_deadline(self) -> float | None:
        return min((i.until for i in self.items.values()), default=None)

    def take(self, x: MaintenanceProposal | MaintenanceAnswer, now: float
             ) -> Iterator[MaintenanceWindow]:
        if isinstance(x, MaintenanceProposal):
            yield self._propose(x, now)
        else:
            yield self._answer(x, now)

    def _propose(self, p: MaintenanceProposal, now: float) -> MaintenanceWindow:
        check_id("notice_id", p.notice_id)
        if (item := self.items.get(p.notice_id)) is not None:
            if item.proposal == p:
                return item.window
            raise BadInput("notice_id", "already proposed with another window")
        if not isinstance(p.cause, Cause):
            raise BadInput("cause", "one of " + ", ".join(c.value for c in Cause))
        urgency = self.urgency[p.cause]
        latest = p.issued_at + urgency.most_wait
        if not (_finite(p.pause) and p.pause > 0):
            raise BadInput("pause", "more than 0 seconds")
        if not (_finite(p.start) and now + urgency.least_notice <= p.start <= latest):
            raise BadInput("start", f"must give {urgency.least_notice:.0f} s of notice and "
                           f"start by {latest:.0f} ({p.cause.value})")
        start = p.start
        if p.last_checkpoint is not None:
            aligned = checkpoint_starts(p.last_checkpoint, p.checkpoint_every, p.start,
                                        latest, limit=1)
            start = aligned[0] if aligned else start
        window = MaintenanceWindow(p.notice_id, p.tenant, p.job, start, p.pause,
                                   MState.PROPOSED, latest)
        self.items[p.notice_id] = Item(p, MState.PROPOSED, window,
                                       start - urgency.least_notice)
        return window

    def _answer(self, a: MaintenanceAnswer, now: float) -> MaintenanceWindow:
        item = self.items.get(check_id("notice_id", a.notice_id))
        if item is None or item.proposal.tenant != a.tenant:
            raise BadInput("notice_id", "no such notice of yours")
        if item.state is not MState.PROPOSED:
            if item.answer == a:
                return item.window  # a retry
            raise BadInput("notice_id", f"already settled ({item.state.value})")
        if not isinstance(a.windows, tuple | list) or not all(_finite(w) for w in a.windows):
            raise BadInput("windows", "finite times in seconds")
        if len(a.windows) > MAX_WINDOWS:
            raise BadInput("windows", f"at most {MAX_WINDOWS}")
        notice = self.urgency[item.proposal.cause].least_notice
        fits = sorted(w for w in a.windows if now + notice <= w <= item.window.latest)
        if not a.windows:
            event, start = MEvent.ACCEPT, item.window.start
        elif fits:
            event, start = MEvent.FIT, float(fits[0])
        else:
            event, start = MEvent.OVERRIDE, item.window.start
        return self._settle(item, event, start, a)

    def _settle(self, item: Item, event: MEvent, start: float,
                answer: MaintenanceAnswer | None) -> MaintenanceWindow:
        item.state = MAINTENANCE.move(item.state, event)
        w = item.window
        item.window = MaintenanceWindow(w.notice_id, w.tenant, w.job, start, w.pause,
                                        item.state, w.latest)
        item.answer = answer
        item.until = start + w.pause + RETAIN
        return item.window

    def expire(self, now: float) -> Iterable[MaintenanceWindow]:
        out = []
        for notice_id, item in list(self.items.items()):
            if item.until > now:
                continue
            if item.state is MState.PROPOSED:
                out.append(self._settle(item, MEvent.EXPIRE, item.window.start, None))
            else:
                del self.items[notice_id]
        return out
