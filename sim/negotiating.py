"""The negotiation regime in the engine: gang jobs' tenants reserve through the
controller's real negotiation engine, the scheduler keeps holds out of what it gives
others, degraded hosts' validation notices are negotiated to checkpoints, and a prober
proposes and withdraws (sim/negotiation.py states the model).

The simulator decides nothing a tenant is offered: it hands the real
:class:`controller.negotiation.engine.Engine` what the controller would (every pool's
private release, the tenants' proposals and answers, which holds started) on the
simulation clock, as sim/feed.py does with the real redactor.

A part of :class:`sim.engine.Simulation` (a mixin): it works on the simulation's state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from controller.negotiation.engine import Engine, Output, Policy
from controller.negotiation.maintenance import (
    URGENCY,
    MaintenanceAnswer,
    MaintenanceProposal,
    MaintenanceWindow,
    checkpoint_starts,
)
from controller.negotiation.table import MAX_DURATION
from controller.negotiation.types import (
    Accept,
    Cancel,
    CapacityRelease,
    Counter,
    Error,
    Flexibility,
    Hold,
    Offer,
    Proposal,
    Propose,
    Refusal,
    Reject,
    Started,
)
from harmonaize.messages import PoolCapacity
from sim.events import HOLD_DUE, MAINTAIN, NEGOTIATE
from sim.jobs import QUEUED, RUNNING, WAITING, Job
from sim.negotiation import NegotiationCounters, cause_of
from sim.policies import held

#: A maintenance stop lands this long after its window opens: a window at a checkpoint
#: opens as the checkpoint completes, so the stop comes just after the save.
SETTLE_S = 1e-3
#: Work seconds a stop may lose and still count as done without losing work.
CLEAN_S = 1.0


@dataclass
class SimHold:
    job: int
    pool: int
    request_id: str
    tenant: str
    nodes: int
    #: From when the scheduler keeps its hosts out of what it gives others (accepted).
    arm: float
    expires_at: float
    no_show: bool
    closed: bool = False


class Negotiating:
    def _nego_init(self) -> None:
        plan = self.regime.negotiation
        self.nego = plan
        self.nstats = NegotiationCounters()
        self.holds_in: list[dict[str, SimHold]] = [{} for _ in self.cluster.pools]
        self.hold_of: dict[int, SimHold] = {}     # a job's hold, while it may claim it
        self.hold_by_job: dict[int, SimHold] = {}
        self.notices: list[tuple[int, int]] = []
        #: Gang jobs refused so far, per pool: their tenants ask again at each release.
        self.retry: list[dict[int, int]] = [{} for _ in self.cluster.pools]
        self.negotiator: Engine | None = None
        self.probing = self.maintaining = False
        if plan is None:
            return
        self.negotiator = Engine(Policy(dict.fromkeys(self.cfg.tenants, 1.0),
                                        max_share=plan.max_share))
        self.probing = plan.probe
        self.maintaining = plan.maintenance != "off"
        if self.maintaining:
            self.rollback["maintenance"] = 0.0
            self.pauses["maintenance"] = 0.0

    def _nego_events(self) -> None:
        plan = self.nego
        if plan is None or not plan.reservations:
            return
        for j in self.jobs:
            cap = self.cluster.pools[j.pool].nodes * self.gpn
            if plan.gang_above < j.n <= cap:
                self._push(max(0.0, j.arrival - plan.lead_s), NEGOTIATE, j.index)

    def _nstep(self, inputs: list) -> list[Output]:
        assert self.negotiator is not None
        out, _ = self.negotiator.step(inputs, self.now)
        return out

    # --- what the private feed released, as the controller hands it over ----------------

    def _nrelease(self, body: PoolCapacity) -> None:
        free = body.gpus_available.lo
        hi = body.gpus_available.hi
        self._nstep([CapacityRelease(body.pool, body.gpu_class, free,
                                     hi if hi is not None else free, self.now)])
        pool = self.pool_index[body.pool]
        for index in list(self.retry[pool]):
            self._negotiate(index)

    # --- reservations --------------------------------------------------------------------

    def _negotiate(self, index: int) -> None:
        """The gang job's tenant proposes (again, after a refusal, at each release of its
        pool until it holds or its job has started)."""
        j = self.jobs[index]
        attempt = self.retry[j.pool].pop(index, 0)
        if j.first_start >= 0 or j.state not in (WAITING, QUEUED):
            return  # started (or an arrival at the very start): nothing to reserve
        plan = self.nego
        assert plan is not None
        count = held(j.n, self.gpn)
        rid = f"{j.name}.{attempt}"
        earliest = max(j.arrival, self.now)
        p = Proposal(rid, j.tenant, j.pool_name, j.gpu_class, count, count, earliest,
                     earliest + plan.window_s, min(j.work, MAX_DURATION), Flexibility.TIME)
        self.nstats.proposals += 1
        answer = _answer(self._nstep([Propose(p)]), rid)
        if not isinstance(answer, Offer) or (isinstance(answer, Counter)
                                             and answer.departs != "time"):
            if isinstance(answer, Offer):
                self._nstep([Reject(j.tenant, rid, answer.offer_id)])
            elif isinstance(answer, Refusal):
                self.nstats.refusals += 1
            else:
                self.nstats.errors += 1  # no release yet, or more than its upper edge
            self.retry[j.pool][index] = attempt + 1
            return
        self.nstats.offers += 1
        hold = next((o for o in self._nstep([Accept(j.tenant, rid, answer.offer_id)])
                     if isinstance(o, Hold)), None)
        if hold is None:
            self.nstats.errors += 1
            return
        self.nstats.holds += 1
        draw = random.Random(f"{self.cfg.seed}:no-show:{j.name}").random()
        arm = self.now if plan.drain_s is None else max(self.now, hold.start - plan.drain_s)
        h = SimHold(index, j.pool, rid, j.tenant, hold.count // self.gpn, arm,
                    hold.expires_at, draw < plan.no_show_rate)
        self.holds_in[j.pool][rid] = h
        self.hold_by_job[index] = h
        if not h.no_show:
            self.hold_of[index] = h
            if j.state == QUEUED:  # it waits already: to the front, to claim its hold
                self.queue[j.pool].remove(j)
                self.queue[j.pool].insert(0, j)
        self._push(max(self.now, hold.expires_at - 1.0), HOLD_DUE, index, 0)

    def _front(self, j: Job) -> bool:
        """Whether ``j`` comes to claim a hold (it goes to the front of the queue)."""
        return j.index in self.hold_of

    def _may_take(self, j: Job, spot: tuple[list[int], int]) -> bool:
        """Whether ``j`` may start on ``spot`` beside the pool's armed holds: the whole
        free hosts left must cover those held for others."""
        holds = self.holds_in[j.pool]
        now = self.now
        reserved = sum(h.nodes for h in holds.values()
                       if h.arm <= now and (h.job != j.index or h.no_show))
        if reserved == 0:
            return True
        uses = sum(1 for n in spot[0] if self.free[n] == self.gpn)
        return len(self.free_sets[j.pool][self.gpn]) - uses >= reserved

    def _holds_pending(self, pool: int) -> bool:
        return bool(self.holds_in[pool])

    def _hold_started(self, j: Job) -> None:
        h = self.hold_of.pop(j.index)
        self._close(h)
        self.nstats.honoured += 1
        self._nstep([Started(h.tenant, h.request_id)])

    def _close(self, h: SimHold) -> None:
        h.closed = True
        self.holds_in[h.pool].pop(h.request_id, None)

    def _hold_due(self, index: int, phase: int) -> None:
        h = self.hold_by_job[index]
        if h.closed:
            return
        if h.no_show:
            if phase == 0:
                self._push(h.expires_at, HOLD_DUE, index, 1)
                return
            self._nstep([])  # the engine expires it and charges the tenant's record
            self.nstats.no_shows += 1
        else:
            # the job came and the hosts were not there in time: the provider's failure
            self.hold_of.pop(index, None)
            self._nstep([Cancel(h.tenant, h.request_id)])
            self.nstats.not_honoured += 1
        self._close(h)
        self._schedule(h.pool)

    # --- maintenance ---------------------------------------------------------------------

    def _notice(self, node: int, desc: str) -> None:
        """A host degraded: a validation notice for each job on it, its window settled."""
        plan = self.nego
        assert plan is not None
        cause = cause_of(desc)
        urgency = URGENCY[cause]
        declared = plan.maintenance == "checkpoint"
        for j in list(self.node_jobs[node].values()):
            self._advance(j, self.now)
            last = max(self.now, j.pause_until) - j.phase
            notice = f"notice-{len(self.notices)}"
            proposal = MaintenanceProposal(
                notice, j.tenant, j.name, cause, self.now + urgency.least_notice,
                self.cfg.restart_cost, self.now, self.T if declared else 0.0,
                last if declared else None)
            window = _window(self._nstep([proposal]))
            if window is None:
                continue
            if declared:
                counter = checkpoint_starts(last, self.T, self.now + urgency.least_notice,
                                            window.latest)
                window = _window(self._nstep([MaintenanceAnswer(j.tenant, notice, counter)]))
                if window is None:
                    continue
            self.nstats.notices += 1
            self._push(window.start + SETTLE_S, MAINTAIN, len(self.notices))
            self.notices.append((j.index, node))

    def _maintain(self, k: int) -> None:
        index, node = self.notices[k]
        j = self.jobs[index]
        if j.state != RUNNING or node not in j.nodes:
            self.nstats.maintenance_moot += 1  # it ended or moved on before the window
            return
        self._advance(j, self.now)
        lost = j.P - j.S
        self.nstats.maintained += 1
        self.nstats.maintenance_lost_gpu_s += lost * j.n
        if lost <= CLEAN_S:
            self.nstats.maintained_clean += 1
        self._kill(j, "maintenance")
        self._schedule(j.pool)

    # --- the prober ------------------------------------------------------------------------

    def _probe(self) -> None:
        """The attacker proposes the most each pool could hold and withdraws at once."""
        assert self.negotiator is not None
        tenant = self.cfg.tenants[self.cfg.attacker]
        for p in self.cluster.pools:
            release = self.negotiator.view.get((p.name, p.gpu_class))
            if release is None:
                continue
            rid = f"probe-{self.nstats.probes}"
            self.nstats.probes += 1
            proposal = Proposal(rid, tenant, p.name, p.gpu_class, 1,
                                max(1, release.ceiling), self.now, self.now, 3600.0,
                                Flexibility.COUNT)
            answer = _answer(self._nstep([Propose(proposal)]), rid)
            offered = 0
            if isinstance(answer, Offer):
                offered = answer.count
                self._nstep([Reject(tenant, rid, answer.offer_id)])
            self.records.probes.append((self.now, p.index, offered))

    def nego_counters(self) -> dict[str, float]:
        return dict(vars(self.nstats)) if self.nego is not None else {}


def _answer(out: list[Output], request_id: str) -> Offer | Refusal | Error | None:
    for o in out:
        if isinstance(o, Offer | Refusal) and o.request_id == request_id:
            return o
        if isinstance(o, Error):
            return o
    return None


def _window(out: list[Output]) -> MaintenanceWindow | None:
    return next((o for o in out if isinstance(o, MaintenanceWindow)), None)
