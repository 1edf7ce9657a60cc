"""The negotiation engine: inputs and ``now`` in, answers and the next deadline out.

Sans-I/O like the controller's other cores: it reads no clock and does no I/O; its shell
(the tenant doors, later) hands it what tenants said, what the private feed released per
pool, and what the scheduler placed. Its whole state is plain data
(controller/negotiation/plain.py), so it can be stored and restored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.negotiation import table
from controller.negotiation.capacity import Record, Span, allowance, fit, peak, shares
from controller.negotiation.checks import check_id, check_proposal, check_tenant
from controller.negotiation.maintenance import (
    URGENCY,
    Cause,
    MaintenanceAnswer,
    MaintenanceBook,
    MaintenanceProposal,
    MaintenanceWindow,
    Urgency,
)
from controller.negotiation.table import ANSWERABLE, NEGOTIATION, OPEN, Event
from controller.negotiation.types import (
    Accept,
    BadInput,
    Cancel,
    CapacityRelease,
    Closed,
    Counter,
    CounterProposal,
    Error,
    Hold,
    Offer,
    Proposal,
    Propose,
    Reason,
    Refusal,
    Reject,
    Release,
    Started,
    State,
)

Input = (Propose | Accept | Reject | CounterProposal | Release | CapacityRelease | Started
         | Cancel | MaintenanceProposal | MaintenanceAnswer)
Answer = Offer | Counter | Refusal | Hold | Closed
Output = Answer | Error | MaintenanceWindow
Key = tuple[str, str]


@dataclass(frozen=True)
class Policy:
    """The operator's terms: who may negotiate and with what weight, and the bounds."""

    weights: dict[str, float]
    #: No tenant holds more than this part of a pool's released free GPUs.
    max_share: float = 0.5
    offer_ttl: float = table.OFFER_TTL
    max_rounds: int = table.MAX_ROUNDS
    max_open: int = table.MAX_OPEN
    #: How long each condition behind a maintenance window may wait.
    urgency: dict[Cause, Urgency] = field(default_factory=lambda: dict(URGENCY))


@dataclass
class Negotiation:
    proposal: Proposal
    state: State
    round: int
    #: When the state expires (open states) or is forgotten (final ones).
    until: float
    offer: Offer | None = None
    hold: Hold | None = None
    #: The last answer, repeated to a retry.
    answer: Answer | None = None
    started_at: float | None = None


def offer_id(tenant: str, request_id: str, round_: int) -> str:
    """The same on every controller for the same negotiation's round (a leader change
    answers a retry alike)."""
    digest = hashlib.sha256(f"{tenant}\n{request_id}\n{round_}".encode()).hexdigest()
    return f"of-{digest[:20]}"


@dataclass
class Engine:
    policy: Policy
    #: The last private release per (pool, GPU class).
    view: dict[tuple[str, str], CapacityRelease] = field(default_factory=dict)
    negotiations: dict[Key, Negotiation] = field(default_factory=dict)
    #: Closed request ids and until when they are refused as such.
    closed: dict[Key, float] = field(default_factory=dict)
    records: dict[str, Record] = field(default_factory=dict)
    maintenance: MaintenanceBook = field(default_factory=MaintenanceBook)

    def __post_init__(self) -> None:
        self.maintenance.urgency = dict(self.policy.urgency)

    def step(self, inputs: Iterable[Input], now: float) -> tuple[list[Output], float | None]:
        out: list[Output] = []
        self._expire(now, out)
        for item in inputs:
            try:
                out.extend(self._one(item, now))
            except BadInput as bad:
                out.append(Error(_tenant_of(item), bad.field, bad.message))
        # what the inputs left due already (a window with no time left to answer) moves
        # now: the deadline returned is always in the future
        self._expire(now, out)
        return out, self.next_deadline()

    def next_deadline(self) -> float | None:
        times = [n.until for n in self.negotiations.values()]
        times += self.closed.values()
        if (due := self.maintenance.next_deadline()) is not None:
            times.append(due)
        return min(times, default=None)

    def holds(self) -> list[Hold]:
        """Holds not yet started, released, cancelled or expired (for operators)."""
        return [n.hold for n in self.negotiations.values()
                if n.state is State.HELD and n.hold is not None]

    def spans(self, tenant: str | None, pool: str, gpu_class: str, now: float) -> list[Span]:
        """What a tenant (every tenant: None) holds or is offered in a pool."""
        out = []
        release = self.view.get((pool, gpu_class))
        for (owner, _), n in self.negotiations.items():
            p = n.proposal
            if (tenant is not None and owner != tenant) or (p.pool, p.gpu_class) != (
                    pool, gpu_class):
                continue
            if n.state in ANSWERABLE and n.offer is not None:
                out.append((n.offer.start, n.offer.end, n.offer.count))
            elif n.state is State.HELD and n.hold is not None:
                out.append((n.hold.start, n.hold.end, n.hold.count))
            elif (n.state is State.STARTED and n.hold is not None
                  and n.started_at is not None and now < n.hold.end
                  and (release is None or release.at <= n.started_at)):
                # placed: counted until a release taken after it shows it
                out.append((n.hold.start, n.hold.end, n.hold.count))
        return out

    def allowed(self, tenant: str, pool: str, gpu_class: str, now: float) -> int:
        release = self.view.get((pool, gpu_class))
        if release is None:
            return 0
        share = shares(self.policy.weights, self.policy.max_share).get(tenant, 0.0)
        return allowance(release.free, share, self._record(tenant).factor(now))

    # --- inputs ---------------------------------------------------------------------

    def _one(self, item: Input, now: float) -> list[Output]:
        if isinstance(item, CapacityRelease):
            return self._capacity(item)
        if isinstance(item, MaintenanceProposal | MaintenanceAnswer):
            if isinstance(item, MaintenanceAnswer):
                check_tenant(item.tenant, self.policy.weights)
            return list(self.maintenance.take(item, now))
        if isinstance(item, Propose):
            return self._propose(item.proposal, now)
        if isinstance(item, CounterProposal):
            return self._counter(item, now)
        tenant = check_tenant(item.tenant, self.policy.weights)
        n = self._find(tenant, item.request_id)
        if isinstance(item, Accept | Reject):
            return self._answer_offer(n, item, now)
        if isinstance(item, Release):
            return self._end(n, Event.RELEASE, State.RELEASED, now)
        if isinstance(item, Started):
            return self._end(n, Event.START, State.STARTED, now)
        return self._end(n, Event.CANCEL, State.CANCELLED, now)

    def _capacity(self, c: CapacityRelease) -> list[Output]:
        if c.free < 0 or c.ceiling < 0:
            raise BadInput("free", "a release's counts are 0 or more")
        self.view[(c.pool, c.gpu_class)] = CapacityRelease(
            c.pool, c.gpu_class, c.free, max(c.free, c.ceiling), c.at)
        return []

    def _find(self, tenant: str, request_id: str) -> Negotiation:
        key = (tenant, check_id("request_id", request_id))
        if key in self.closed:
            raise BadInput("request_id", "closed: its negotiation ended; propose under a "
                           "new id")
        n = self.negotiations.get(key)
        if n is None:
            raise BadInput("request_id", "no such negotiation of yours")
        return n

    def _propose(self, p: Proposal, now: float) -> list[Output]:
        key = (check_tenant(p.tenant, self.policy.weights), check_id("request_id",
                                                                       p.request_id))
        if key in self.closed:
            raise BadInput("request_id", "closed: its negotiation ended; propose under a "
                           "new id")
        if (n := self.negotiations.get(key)) is not None:
            if n.proposal == p and n.answer is not None:
                return [n.answer]  # a retry: the same answer
            raise BadInput("request_id", "already used for a different proposal")
        check_proposal(p, self.policy.weights, self.view, now)
        opened = sum(1 for (t, _), m in self.negotiations.items()
                     if t == p.tenant and m.state in OPEN)
        if opened >= self.policy.max_open:
            raise BadInput("request_id", f"{opened} negotiations of yours are open; "
                           "let one close first")
        n = Negotiation(p, State.PROPOSED, 1, now)
        self.negotiations[key] = n
        return [self._decide(n, now)]

    def _decide(self, n: Negotiation, now: float) -> Answer:
        p = n.proposal
        if n.round > self.policy.max_rounds:
            return self._finish(n, Event.REFUSE, Refusal(p.request_id, p.tenant,
                                                         Reason.ROUNDS), now)
        found = fit(p, self.allowed(p.tenant, p.pool, p.gpu_class, now),
                    self.spans(p.tenant, p.pool, p.gpu_class, now), now)
        if found is None:
            return self._finish(n, Event.REFUSE, Refusal(p.request_id, p.tenant,
                                                         Reason.NO_CAPACITY), now)
        count, start, departs = found
        args = (offer_id(p.tenant, p.request_id, n.round), p.request_id, p.tenant, count,
                start, start + p.duration, now + self.policy.offer_ttl, n.round)
        offer = Counter(*args, departs=departs) if departs else Offer(*args)
        n.state = NEGOTIATION.move(n.state, Event.COUNTER if departs else Event.OFFER)
        n.offer, n.answer, n.until = offer, offer, offer.expires_at
        return offer

    def _offer_of(self, n: Negotiation, offer: str) -> Offer:
        if n.offer is None or n.offer.offer_id != offer:
            raise BadInput("offer_id", "no such offer of yours")
        return n.offer

    def _answer_offer(self, n: Negotiation, a: Accept | Reject, now: float) -> list[Output]:
        offer = self._offer_of(n, a.offer_id)
        accept = isinstance(a, Accept)
        if n.state in ((State.HELD, State.STARTED) if accept else (State.REJECTED,)):
            return [n.answer] if n.answer is not None else []  # a retry
        if n.state is State.EXPIRED and n.hold is None:
            raise BadInput("offer_id", f"expired at {offer.expires_at:.0f}; propose again")
        if n.state not in ANSWERABLE:
            raise BadInput("offer_id", f"the negotiation is {n.state.value}")
        if not accept:
            return [self._finish(n, Event.REJECT, Closed(
                offer.request_id, offer.tenant, State.REJECTED), now)]
        p = n.proposal
        grace = min(table.START_GRACE, offer.end - offer.start)
        n.hold = Hold(p.request_id, p.tenant, p.pool, p.gpu_class, offer.count, offer.start,
                      offer.end, offer.start + grace)
        n.state = NEGOTIATION.move(n.state, Event.ACCEPT)
        n.answer, n.until = n.hold, n.hold.expires_at
        return [n.hold]

    def _counter(self, c: CounterProposal, now: float) -> list[Output]:
        p = c.proposal
        n = self._find(check_tenant(p.tenant, self.policy.weights), p.request_id)
        if n.proposal == p and n.answer is not None and n.round > 1:
            return [n.answer]  # a retry of the counter already answered
        self._offer_of(n, c.offer_id)
        if n.state not in ANSWERABLE:
            raise BadInput("offer_id", f"the negotiation is {n.state.value}")
        check_proposal(p, self.policy.weights, self.view, now)
        n.state = NEGOTIATION.move(n.state, Event.TENANT_COUNTER)
        n.proposal, n.offer, n.round = p, None, n.round + 1
        return [self._decide(n, now)]

    def _end(self, n: Negotiation, event: Event, final: State, now: float) -> list[Output]:
        """A hold released, started or cancelled; a retry answers the same."""
        if n.state is final:
            return [n.answer] if n.answer is not None else []
        if n.state is not State.HELD or n.hold is None:
            raise BadInput("request_id", f"no hold: the negotiation is {n.state.value}")
        hold, charged = n.hold, 0.0
        gpu_seconds = hold.count * (hold.end - hold.start)
        record = self._record(hold.tenant).decayed(now)
        if final is State.STARTED:
            n.started_at = now
            record.used += gpu_seconds
        elif final is State.RELEASED and now > hold.start - table.FREE_RELEASE:
            charged = gpu_seconds
            record.no_show += charged
        self.records[hold.tenant] = record
        return [self._finish(n, event, Closed(hold.request_id, hold.tenant, final, charged),
                             now)]

    # --- expiry ---------------------------------------------------------------------

    def _finish(self, n: Negotiation, event: Event, answer: Answer, now: float) -> Answer:
        n.state = NEGOTIATION.move(n.state, event)
        n.answer = answer
        n.until = now + table.RETAIN
        if n.state is State.STARTED and n.hold is not None:
            n.until = max(now, n.hold.end) + table.RETAIN  # a retry while it runs
        self._bound_retained(n.proposal.tenant, now)
        return answer

    def _expire(self, now: float, out: list[Output]) -> None:
        for key, n in list(self.negotiations.items()):
            if n.until > now:
                continue
            if n.state in OPEN:
                charged = 0.0
                if n.state is State.HELD and n.hold is not None:
                    # a no-show: the GPUs were kept from everyone else for nothing
                    charged = n.hold.count * (n.hold.end - n.hold.start)
                    record = self._record(key[0]).decayed(now)
                    record.no_show += charged
                    self.records[key[0]] = record
                out.append(self._finish(n, Event.EXPIRE, Closed(key[1], key[0],
                                                                State.EXPIRED, charged), now))
            else:
                self._forget(key, now)
        for key, until in list(self.closed.items()):
            if until <= now:
                del self.closed[key]
        out.extend(self.maintenance.expire(now))

    def _forget(self, key: Key, now: float) -> None:
        del self.negotiations[key]
        self.closed[key] = now + table.TOMBSTONE
        mine = sorted((until, k) for k, until in self.closed.items() if k[0] == key[0])
        for _, old in mine[:max(0, len(mine) - table.MAX_TOMBSTONES)]:
            del self.closed[old]

    def _bound_retained(self, tenant: str, now: float) -> None:
        final = sorted((n.until, k) for k, n in self.negotiations.items()
                       if k[0] == tenant and n.state not in OPEN)
        for _, key in final[:max(0, len(final) - table.MAX_RETAINED)]:
            self._forget(key, now)

    def _record(self, tenant: str) -> Record:
        return self.records.get(tenant) or Record(at=0.0)

    def load(self, pool: str, gpu_class: str, start: float, end: float, now: float) -> int:
        """Every tenant's holds and offers at their peak in ``[start, end)`` (tests and
        operators: never part of what a tenant is told)."""
        return peak(self.spans(None, pool, gpu_class, now), start, end)


def _tenant_of(item: Input) -> str:
    if isinstance(item, Propose | CounterProposal):
        return str(item.proposal.tenant)
    return str(getattr(item, "tenant", ""))
