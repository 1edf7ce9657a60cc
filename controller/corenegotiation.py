"""The controller core's part that negotiates (see controller/core.py): tenants'
negotiation requests into the sans-I/O engine (controller/negotiation/), the private
feed's pool releases as the engine's capacity view, its expiries as the core's deadlines,
and its state in the Commit after every change, as rows of what changed
(controller/negotiationrows.py: stored, and replicated on the bus with the rest of a
Commit), so a restart or a new leader keeps holds and open offers.

The engine runs on Unix time: its offers and holds are told to tenants, who propose in
Unix time. The core keeps its monotonic ``now`` and learns the wall clock's offset from
each tick (and from its construction), so it still reads no clock itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from controller import negotiationrows
from controller.negotiation import plain
from controller.negotiation.engine import Engine, Output, Policy
from controller.negotiation.maintenance import (
    Cause,
    MaintenanceAnswer,
    MaintenanceProposal,
    MaintenanceWindow,
    MState,
)
from controller.negotiation.types import (
    Accept,
    CapacityRelease,
    Closed,
    Counter,
    CounterProposal,
    Error,
    Flexibility,
    Hold,
    Offer,
    Proposal,
    Propose,
    Refusal,
    Reject,
    Release,
    Started,
    State,
)
from controller.negotiation.types import Cancel as CancelHold
from controller.outputs import AnswerTenant, SendToAgent
from controller.redactionconfig import Mode
from harmonaize.messages import (
    ErrorCode,
    MaintenanceCounter,
    Message,
    Negotiated,
    NegotiationAccept,
    NegotiationCounter,
    NegotiationExpired,
    NegotiationList,
    NegotiationPropose,
    NegotiationReject,
    NegotiationRelease,
    Outcome,
    PoolCapacity,
    Reply,
)

if TYPE_CHECKING:
    from controller.cluster import Cluster
    from controller.config import NegotiationSection
    from controller.notices import Notices
    from controller.outputs import Output as CoreOutput
    from controller.publications import Publications
    from controller.redaction import Redactor

log = logging.getLogger("harmonaize.controller")

#: The tenant's requests this part answers.
REQUESTS = (NegotiationPropose, NegotiationCounter, NegotiationAccept, NegotiationReject,
            NegotiationRelease, NegotiationList, MaintenanceCounter)


def policy_of(section: NegotiationSection) -> Policy:
    return Policy(weights=dict(section.weights), max_share=section.max_share,
                  offer_ttl=section.offer_ttl, urgency=section.urgency())


def restore_engine(section: NegotiationSection, state: Mapping[str, Any] | None) -> Engine:
    """The engine as the store kept it, by rows (a new one where nothing or an unreadable
    state was kept: holds are then lost, which is logged)."""
    if not state:
        return Engine(policy_of(section))
    try:
        return plain.from_plain(policy_of(section), negotiationrows.joined(state))
    except (KeyError, TypeError, ValueError) as exc:
        log.error("the stored negotiation state is unreadable, begun anew: %s", exc)
        return Engine(policy_of(section))


def negotiated(item: Output) -> Negotiated:
    """An engine's answer as the wire carries it."""
    if isinstance(item, Offer):  # a Counter too
        counter = isinstance(item, Counter)
        return Negotiated(Outcome.COUNTER if counter else Outcome.OFFER, item.request_id,
                          item.offer_id, item.count, item.start, item.end, item.expires_at,
                          item.round, departs=item.departs if isinstance(item, Counter)
                          else "")
    if isinstance(item, Refusal):
        return Negotiated(Outcome.REFUSAL, item.request_id, reason=item.reason.value)
    if isinstance(item, Hold):
        return Negotiated(Outcome.HOLD, item.request_id, count=item.count, start=item.start,
                          end=item.end, expires_at=item.expires_at)
    if isinstance(item, Closed):
        return Negotiated(Outcome.CLOSED, item.request_id, state=item.state.value,
                          charged=item.charged)
    assert isinstance(item, MaintenanceWindow)
    return Negotiated(Outcome.WINDOW, item.notice_id, start=item.start,
                      end=item.start + item.pause, expires_at=item.latest,
                      state=item.state.value)


def _proposal(tenant: str, m: NegotiationPropose | NegotiationCounter) -> Proposal:
    return Proposal(m.request_id, tenant, m.pool, m.gpu_class, m.min_count, m.max_count,
                    m.earliest_start, m.latest_start, m.duration,
                    Flexibility(m.flexibility.value))


def engine_input(tenant: str, m: Message) -> Any:
    """A tenant's request as the engine's input."""
    if isinstance(m, NegotiationPropose):
        return Propose(_proposal(tenant, m))
    if isinstance(m, NegotiationCounter):
        return CounterProposal(m.offer_id, _proposal(tenant, m))
    if isinstance(m, NegotiationAccept):
        return Accept(tenant, m.request_id, m.offer_id)
    if isinstance(m, NegotiationReject):
        return Reject(tenant, m.request_id, m.offer_id)
    if isinstance(m, NegotiationRelease):
        return Release(tenant, m.request_id)
    assert isinstance(m, MaintenanceCounter)
    return MaintenanceAnswer(tenant, m.notice, tuple(m.windows))


class NegotiationPart:
    """Negotiation in the core: a part of :class:`controller.core.ControllerCore`, which
    holds the state (``negotiation``, ``_wall_offset``, ``_dirty_tenants``,
    ``_dirty_view``)."""

    negotiation: Engine
    _wall_offset: float
    #: Tenants whose rows changed since the last Commit, and whether the view did.
    _dirty_tenants: set[str]
    _dirty_view: bool
    _held: list[CoreOutput]
    notices: Notices
    cluster: Cluster
    feed: Publications
    redactor: Redactor

    if TYPE_CHECKING:  # in controller/core.py
        def _release(self) -> list[CoreOutput]: ...

    def _negotiate(self, peer: bytes, tenant: str, seq: int, body: Message,
                   now: float) -> list[CoreOutput]:
        """A tenant's negotiation request: answered after the Commit that stores what it
        changed (a refusal of bad input changes nothing and is answered at once)."""
        wall = now + self._wall_offset
        self._step_negotiation([], wall)  # what expired is gone before the request is read
        if isinstance(body, NegotiationList):
            return [AnswerTenant(peer, Reply(seq, True, negotiation=self.negotiations_of(
                tenant, wall)))]
        outputs, _ = self.negotiation.step([engine_input(tenant, body)], wall)
        errors = [o for o in outputs if isinstance(o, Error)]
        if errors:
            error = errors[0]
            return [AnswerTenant(peer, Reply(seq, False, f"{body.KIND}.{error}"[:1000],
                                             ErrorCode.INVALID.value))]
        self._dirty_tenants.add(tenant)
        self._windows_settled(outputs)
        key = getattr(body, "request_id", None) or getattr(body, "notice", "")
        mine = [negotiated(o) for o in outputs if _key_of(o) == (tenant, key)]
        self._held.append(AnswerTenant(peer, Reply(seq, True, negotiation=tuple(mine[-1:]))))
        return self._release()

    def negotiations_of(self, tenant: str, wall: float) -> tuple[Negotiated, ...]:
        """A tenant's negotiations and maintenance windows as they stand."""
        out = []
        for (owner, _), n in sorted(self.negotiation.negotiations.items()):
            if owner == tenant and n.answer is not None:
                out.append(negotiated(n.answer))
        out += [negotiated(i.window) for i in self.negotiation.maintenance.items.values()
                if i.window.tenant == tenant]
        return tuple(out[:256])

    def _step_negotiation(self, inputs: list[Any], wall: float) -> list[Output]:
        """Give the engine inputs the controller itself has (releases, cancels, notices)
        and its clock; what changed is stored in the next Commit."""
        due = self.negotiation.next_deadline()
        if not inputs and (due is None or due > wall):
            return []
        self._dirty_tenants |= negotiationrows.tenants_due(self.negotiation, wall)
        self._dirty_tenants |= {str(t) for i in inputs if (t := getattr(i, "tenant", None))}
        self._dirty_view |= any(isinstance(i, CapacityRelease) for i in inputs)
        outputs, _ = self.negotiation.step(inputs, wall)
        self._dirty_tenants |= {_key_of(o)[0] for o in outputs if _key_of(o)[0]}
        self._windows_settled(outputs)
        self._tell_expired(outputs, wall)
        for out in outputs:
            if isinstance(out, Error):
                log.warning("negotiation: %s refused: %s", out.tenant or "(controller)", out)
            elif isinstance(out, Closed) and out.charged:
                log.info("negotiation %s of %s %s, %g GPU-seconds charged", out.request_id,
                         out.tenant, out.state.value, out.charged)
        return outputs

    def _released_capacity(self, topic: str, body: PoolCapacity, wall: float) -> None:
        """A pool's private release: the engine's view of it (the lower edge of its free
        GPUs; the upper edge, where the release has one, as the most it could hold)."""
        if not self.negotiation.policy.weights:
            return  # nobody negotiates: nothing to keep
        free = body.gpus_available.lo
        ceiling = body.gpus_available.hi if body.gpus_available.hi is not None else free
        self._step_negotiation([CapacityRelease(body.pool, body.gpu_class, free, ceiling,
                                                wall)], wall)

    def _maintenance_window(self, notice_id: str, tenant: str, job: str, *, start: float,
                            pause: float, wall: float, cause: Cause = Cause.ROUTINE,
                            checkpoints: tuple[float, float] = (0.0, 0.0)) -> None:
        """A new validation notice for a tenant that negotiates: its window, proposed,
        bounded by the urgency of the condition the host named. A notice that gives less
        than the condition's least notice is not negotiable (approve and defer still are):
        the host's own lead ([validation] notice_lead) decides which notices can be.
        ``checkpoints`` is the job's declared cadence and one checkpoint's time: the
        window is proposed at the next checkpoint."""
        if tenant not in self.negotiation.policy.weights or \
                notice_id in self.negotiation.maintenance.items or pause <= 0:
            return
        if start < wall + self.negotiation.maintenance.urgency[cause].least_notice:
            return
        every, last = checkpoints
        self._step_negotiation([MaintenanceProposal(
            notice_id, tenant, job, cause, start, pause, wall, every,
            last if every > 0 and last > 0 else None)], wall)

    def _tell_expired(self, outputs: list[Output], wall: float) -> None:
        """Each tenant hears of its offers that lapsed and its holds that ended unused, on
        its own negotiation topic (after the Commit that stores the expiry)."""
        if self.redactor.cfg.mode is Mode.NONE:
            return  # no feed at all
        for out in outputs:
            if not (isinstance(out, Closed) and out.state is State.EXPIRED):
                continue
            n = self.negotiation.negotiations.get((out.tenant, out.request_id))
            what = "hold" if n is not None and n.hold is not None else "offer"
            self._held += self.feed.publish(
                NegotiationExpired(out.request_id, what, wall, out.charged),
                negotiation_topic(out.tenant), wall)

    def _windows_settled(self, outputs: list[Output]) -> None:
        """Settled maintenance windows reach their hosts as a deferral does: the notice
        keeps the agreed start (stored in the next Commit) and its host is told it after
        that Commit; the host moves the validation there and tells the job."""
        for out in outputs:
            if not isinstance(out, MaintenanceWindow) or out.state is MState.PROPOSED:
                continue
            decision = self.notices.settle_window(out.notice_id, out.start)
            notice = self.notices.get(out.notice_id)
            if decision is None or notice is None:
                continue
            log.info("maintenance window of notice %s (job %s) %s: starts at %.0f",
                     out.notice_id, out.job, out.state.value, out.start)
            conn = self.cluster.conn_of.get(notice.host)
            if conn is not None:
                self._held.append(SendToAgent(conn, decision))

    def cancel_hold(self, tenant: str, request_id: str, now: float) -> Output:
        """An operator cancels a hold; the engine's answer (a Closed, or an Error)."""
        return self._hold_ends(CancelHold(tenant, request_id), now)

    def start_hold(self, tenant: str, request_id: str, now: float) -> Output:
        """The scheduler placed the job a hold was for: the hold is used (counted to its
        tenant's record, never a no-show); the engine's answer."""
        return self._hold_ends(Started(tenant, request_id), now)

    def _hold_ends(self, item: CancelHold | Started, now: float) -> Output:
        tenant, request_id = item.tenant, item.request_id
        outputs = self._step_negotiation([item], now + self._wall_offset)
        mine = [o for o in outputs if isinstance(o, Error) or _key_of(o) == (tenant,
                                                                             request_id)]
        return mine[-1] if mine else Error(tenant, "request_id", "no such hold")

    def take_negotiation(self) -> Mapping[str, Any] | None:
        """The rows of the engine's state that changed, for the Commit (None: none)."""
        if not (self._dirty_tenants or self._dirty_view):
            return None
        changed = negotiationrows.rows(self.negotiation, sorted(self._dirty_tenants),
                                       self._dirty_view)
        self._dirty_tenants, self._dirty_view = set(), False
        return changed

    def negotiation_deadline(self) -> float | None:
        """The engine's next expiry on the core's clock."""
        due = self.negotiation.next_deadline()
        return None if due is None else due - self._wall_offset


def negotiation_topic(tenant: str) -> str:
    """A tenant's own topic for its negotiations: under its job topics (a subscription
    to ``job/<tenant>/`` has it) and no job's, as no job's name starts with ``@``."""
    return f"job/{tenant}/@negotiation/"


def _key_of(item: Output) -> tuple[str, str]:
    if isinstance(item, MaintenanceWindow):
        return item.tenant, item.notice_id
    return str(getattr(item, "tenant", "")), str(getattr(item, "request_id", ""))
