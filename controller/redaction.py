"""What tenants may know: aggregation and redaction, with no I/O.

The controller and the privacy-utility simulator both use this module, so the
simulator measures the very rules the controller enforces. Inputs are the
provider's view (every host's state, every job's placement, advisories from
agents); outputs are :class:`Publication` s, each a tenant-visible message
with its topic, the tenant allowed to receive it (None: any tenant), and the
earliest time it may go out.

Longer than 400 lines: everything that reaches a tenant's topic (pool capacity in each
mode, a job's health, advice and notices) goes through the topic state kept here, so
that what a topic was told, and when, is decided in one place; what could be taken out
(the rules per kind, the counts, the job index) is in modules of their own (below).

Rules, each with a documented default in :class:`RedactionConfig`:

* Pool capacity, in the default ``private`` mode, is released under differential
  privacy (:mod:`controller.privacy`): one noisy estimate per pool on a fixed schedule
  (every ``release_interval`` seconds, less often for a pool too small for that noise:
  ``noise_share``), within a budget of ``epsilon_per_day`` per pool over any 24
  hours, for pools of any size.
* Pool capacity in ``redacted`` mode (the rule before, kept for comparison) is
  published only when it covers at least ``min_hosts`` hosts, with counts as coarse
  buckets, a trend that is the direction of the last bucket move, and no faster than
  one update per ``min_interval`` seconds plus a random ``jitter``, so the timing of a
  change does not point at one host.
* Pool and GPU-class names are the operator's (:class:`PoolNames`, from the
  controller's ``[pools]``): a host whose agent reports any other name is left out of
  every pool's capacity, so no name an agent made up becomes a tenant's topic.
* Job-scoped messages (checkpoint advice, which members are degraded or
  lost, congestion on the job's paths) go to the owning tenant only, naming
  members in the tenant's own terms and never a host or an address.

``Mode.FULL`` (exact counts, every pool, no delay) and ``Mode.NONE`` (nothing
at all) exist for the simulator's comparison.

This module keeps what tenants were told per topic and schedules what is new; the
rules per kind of message are in controller/poolredaction.py (pool capacity) and
controller/jobredaction.py (a job's own messages), the settings and names in
controller/redactionconfig.py, each pool's counts as hosts change in
controller/pooltally.py and the jobs to judge again in controller/jobindex.py.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from controller.jobindex import JobIndex
from controller.jobredaction import (
    job_health,
    rebuilt_advisory,
    rebuilt_notice,
)
from controller.poolredaction import (
    aged,
    private_capacity,
    shaped_capacities,
    trend,
    true_counts,
)
from controller.pooltally import PoolTally
from controller.privacy import (
    Ledger,
    Plan,
    Sampler,
    opendp_sampler,
    release_epsilon,
    sized_plan,
)
from controller.redactionconfig import (
    Mode,
    PoolNames,
    PoolPrivacy,
    RedactionConfig,
    Unit,
    job_topic,
    pool_topic,
    tenant_of,
)
from controller.releaseschedule import Schedules, pool_privacy
from controller.revisions import content_of, with_revision
from controller.types import HostState, Placement, Publication
from harmonaize.messages import (
    JobAdvisory,
    JobHealth,
    Message,
    PoolCapacity,
    Trend,
    TuningStatus,
    ValidationNotice,
)


@dataclass
class _Topic:
    current: Message | None = None       # what subscribers have been told
    pending: Message | None = None       # the newest content not yet published
    pending_at: float = 0.0              # when it may go out
    last_published: float = float("-inf")
    revision: int = 0


@dataclass
class Redactor:
    cfg: RedactionConfig = field(default_factory=RedactionConfig)
    rng: random.Random = field(default_factory=random.Random)
    placements: dict[str, Placement] = field(default_factory=dict)
    _topics: dict[str, _Topic] = field(default_factory=dict)
    _trend: dict[str, Trend] = field(default_factory=dict)
    _out: list[Publication] = field(default_factory=list)
    #: Each multi-host job's tuning as the controller's agreement sees it.
    _tuning: dict[str, tuple[str, TuningStatus]] = field(default_factory=dict)
    #: Private mode: the noise (None: OpenDP's secure sampler) and the accountant.
    sampler: Sampler | None = None
    ledger: Ledger = field(default_factory=Ledger)
    #: The latest hosts and each pool's counts of them (a private release counts them
    #: when it is due; the other modes, at each observation).
    tally: PoolTally = field(default_factory=PoolTally)
    #: Private mode: each pool topic's plan and next release (controller/releaseschedule.py).
    schedules: Schedules = field(default_factory=Schedules)
    #: Private mode, ``stale_after``: each pool's latest release (when, what) and when it
    #: is next published again, widened for its age.
    _released: dict[str, tuple[float, PoolCapacity]] = field(default_factory=dict)
    _refresh_at: dict[str, float] = field(default_factory=dict)
    #: The names tenants may see (None: every name, as the simulator's own hosts have).
    names: PoolNames | None = None
    #: For :meth:`observe_changes`: the jobs whose health may have changed, and the
    #: rules it was last judged under (other rules: every job again).
    _jobs: JobIndex = field(default_factory=JobIndex)
    _judged_under: RedactionConfig | None = None

    @property
    def held_back(self) -> Counter[tuple[str, str]]:
        """Hosts left out of capacity as last observed, by the (pool, class) their agents
        reported."""
        return self.tally.held_back

    # --- inputs ---------------------------------------------------------------------

    def place(self, placement: Placement) -> None:
        self._jobs.place(placement, self.placements.get(placement.job))
        self.placements[placement.job] = placement

    def restore(self, topic: str, body: Message) -> None:
        """A condition tenants were told before a restart: what is new is judged against
        it, and its revision goes on from there (never back to 1)."""
        if isinstance(body, PoolCapacity | JobHealth):
            self._topics[topic] = _Topic(current=body, revision=body.revision)
        if isinstance(body, PoolCapacity):
            self._trend[topic] = body.trend

    def tuning(self, job: str, choice: str, status: TuningStatus) -> bool:
        """The choice in force for a job and whether its ranks agree (from the
        controller's own comparison of every host's records, never an agent's words).
        Returns whether it changed (then observe() again publishes it)."""
        changed = self._tuning.get(job) != (choice, status)
        self._tuning[job] = (choice, status)
        if changed:
            self._jobs.retuned(job)
        return changed

    def remove_job(self, job: str) -> None:
        self._jobs.remove(job, self.placements.pop(job, None))
        self._tuning.pop(job, None)
        for topic in [t for t in self._topics if t.startswith("job/") and
                      t.endswith(f"/{job}/")]:
            del self._topics[topic]

    def observe(self, hosts: Iterable[HostState], now: float,
                jobs: Iterable[str] | None = None) -> None:
        """Recompute every aggregate from exactly these hosts' current states.

        ``jobs``: the placed jobs whose health may have changed, in the order to look
        at them (None: every placed job). A caller that knows which hosts changed (the
        simulator) passes the jobs on them; the health of any other job would come out
        as it is, and an unchanged condition publishes nothing anyway.
        """
        if self.cfg.mode is Mode.NONE:
            return
        self.tally.rebuild(hosts, self.names, self.cfg.host_gpus)
        self._observed(now, jobs)

    def observe_changes(self, changed: Iterable[HostState], now: float) -> None:
        """As :meth:`observe` of every host seen, given only the hosts whose state may
        have changed since the last call (the controller's core): each pool's counts
        are moved by those hosts alone, so the cost follows what changed, not how many
        hosts there are. What comes out is what :meth:`observe` of them all gives."""
        changed = list(changed)
        self.tally.update(changed, self.names, self.cfg.host_gpus)
        if self.cfg.mode is Mode.NONE:
            return
        # The jobs on a changed host, placed or retuned since (controller/jobindex.py);
        # every job when the rules changed.
        jobs: list[str] | None = self._jobs.take((v.host_id for v in changed),
                                                 self.placements)
        if self._judged_under != self.cfg:
            self._judged_under, jobs = self.cfg, None
        self._observed(now, jobs)

    def _observed(self, now: float, jobs: Iterable[str] | None) -> None:
        if self.cfg.mode is Mode.PRIVATE:
            self._private_truth(now)
        else:
            self._capacity(now)
        by_id = self.tally.views
        placements = self.placements.values() if jobs is None else [
            p for job in jobs if (p := self.placements.get(job)) is not None]
        for placement in placements:
            self._job_health(placement, by_id, now)

    def advisory(self, host_id: str, advisory: JobAdvisory | ValidationNotice, now: float,
                 wall: float, max_pause: float | None = None) -> str | None:
        """Advice or notice from a host for one job, rebuilt for its owner; why not, if not.

        Only a host the job is placed on may speak for it, and nothing in its
        message reaches the tenant as it came: the ranks are the placement's
        own members on that host (of those the agent named, or all of them), the
        reason one of :data:`ADVISORY_REASONS`, a pause at most the job's
        declared ``max_validation_pause`` (``max_pause``; None: no declaration, so
        ``undeclared_max_pause``) and its start within
        :data:`NOTICE_HORIZON` seconds of ``wall`` (the controller's clock).
        """
        if self.cfg.mode is Mode.NONE:
            return None
        if isinstance(advisory, ValidationNotice):
            rebuilt = self.notice(host_id, advisory, now, wall, max_pause)
            return rebuilt if isinstance(rebuilt, str) else None
        found = rebuilt_advisory(self.placements, host_id, advisory)
        if isinstance(found, str):
            return found
        placement, body = found
        self._out.append(Publication(job_topic(placement.tenant, placement.job), body,
                                     placement.tenant, now))
        return None

    def notice(self, host_id: str, notice: ValidationNotice, now: float, wall: float,
               max_pause: float | None = None, *, notice_id: str = "",
               defer_seconds: float = 0.0, max_defer: float = 0.0) -> ValidationNotice | str:
        """A host's validation notice rebuilt for the job's owner (and published), or why
        not. ``notice_id`` is the controller's id of it and ``defer_seconds`` what the
        tenant may still defer it by, both the controller's own; a start deferred may lie
        ``max_defer`` (the declaration's) beyond :data:`NOTICE_HORIZON`."""
        if self.cfg.mode is Mode.NONE:
            return "no_feed"
        found = rebuilt_notice(self.cfg, self.placements, host_id, notice, wall,
                               max_pause=max_pause, notice_id=notice_id,
                               defer_seconds=defer_seconds, max_defer=max_defer)
        if isinstance(found, str):
            return found
        placement, body = found
        self._out.append(Publication(job_topic(placement.tenant, placement.job), body,
                                     placement.tenant, now))
        return body

    def forget_undeclared(self) -> list[str]:
        """Drop every pool topic whose names are not declared (any more); their topics."""
        if self.names is None:
            return []
        gone = []
        for topic in [t for t in set(self._topics) | set(self.schedules.topics())
                      if t.startswith("pool/")]:
            if not self.names.declares(topic):
                gone.append(topic)
                self._topics.pop(topic, None)
                self._trend.pop(topic, None)
                self.schedules.forget(topic)
                self._released.pop(topic, None)
                self._refresh_at.pop(topic, None)
        return sorted(gone)

    def restore_inventory(self, hosts: Iterable[HostState],
                          tally: PoolTally | None = None) -> None:
        """The hosts a restart restored, before any is heard from, counted as the pools'
        counts begin (the shell need not pass them as changed again): each pool's first
        plan is then the one the process before this one last used (controller/
        releaseschedule.py). ``tally``: those hosts counted already (a warm standby's,
        controller/bus/standby.py), taken as they are; ``hosts`` is then not read."""
        if tally is None:
            self.tally.rebuild(hosts, self.names, self.cfg.host_gpus)
        else:
            self.tally = tally
            self.tally.update((), self.names, self.cfg.host_gpus)  # counted anew if the
            # names or the clamp differ from what it was counted under
        self.schedules.restore((pool_topic(*key), sums.hosts)
                               for key, sums in self.tally.pools.items())

    # --- outputs --------------------------------------------------------------------

    def due(self, now: float) -> list[Publication]:
        """Everything that may be published now (immediate messages and due conditions)."""
        out, self._out = self._out, []
        if self.cfg.mode is Mode.PRIVATE:
            self._private_releases(now)
            self._private_refresh(now)
        for topic, state in self._topics.items():
            if state.pending is not None and state.pending_at <= now:
                state.current, state.pending = state.pending, None
                state.last_published = now
                out.append(Publication(topic, state.current, tenant_of(topic), now))
        return out

    def next_due(self) -> float | None:
        times = [s.pending_at for s in self._topics.values() if s.pending is not None]
        if self.cfg.mode is Mode.PRIVATE:
            times += self.schedules.times()
            if self.cfg.stale_after > 0:
                times += self._refresh_at.values()
        return min(times, default=None)

    def plan(self, topic: str | None = None) -> Plan:
        """A pool topic's plan in force (None: the plan of a pool large enough for the
        shortest interval)."""
        if topic is not None and (plan := self.schedules.plan(topic)) is not None:
            return plan
        return self._sized(0)

    def _sized(self, hosts: int) -> Plan:
        """The plan the configuration gives a pool with this inventory (0: none known)."""
        c = self.cfg
        return sized_plan(
            epsilon_per_day=c.epsilon_per_day, fastest=c.release_interval,
            slowest=c.max_release_interval, host_gpus=c.host_gpus, gpu_share=c.gpu_share,
            noise_share=c.noise_share, group=c.job_hosts if c.unit is Unit.JOB else 1,
            hosts=hosts)

    def privacy(self, now: float) -> list[PoolPrivacy]:
        """Each private pool's plan, budget and spending over the last 24 hours."""
        return pool_privacy(self.schedules, self.ledger, self.plan, now)

    def current(self, prefix: str = "") -> list[Publication]:
        """The conditions subscribers have been told, for late joiners and republishing."""
        return [
            Publication(topic, state.current, tenant_of(topic), state.last_published)
            for topic, state in sorted(self._topics.items())
            if state.current is not None and topic.startswith(prefix)
        ]

    # --- rules ----------------------------------------------------------------------

    def _schedule(self, topic: str, body: Message, now: float, immediate: bool) -> None:
        state = self._topics.setdefault(topic, _Topic())
        if (state.pending is not None and state.current is not None
                and content_of(state.current) == content_of(body)):
            state.pending = None  # it changed back before anyone was told: nothing to say
            return
        latest = state.pending if state.pending is not None else state.current
        if latest is not None and content_of(latest) == content_of(body):
            return  # nothing visible changed
        state.revision += 1
        body = with_revision(body, state.revision)
        if immediate or self.cfg.mode is Mode.FULL:
            at = now
        elif state.pending is not None:
            at = state.pending_at  # already waiting: the newer content replaces it
        else:
            at = max(now, state.last_published + self.cfg.min_interval)
            at += self.rng.uniform(0.0, self.cfg.jitter) if self.cfg.jitter else 0.0
        state.pending, state.pending_at = body, at

    def _capacity(self, now: float) -> None:
        for topic, body in shaped_capacities(self.cfg, self.tally.pools):
            self._capacity_message(topic, body, now, immediate=False)

    def _capacity_message(self, topic: str, body: PoolCapacity, now: float,
                          immediate: bool) -> None:
        """Schedule a pool's new capacity with its trend: the direction of the last move
        of (free GPUs, hosts up) as published (lower edges)."""
        state = self._topics.get(topic)
        latest = None if state is None else (state.pending or state.current)
        moved = self._trend[topic] = trend(latest, body, self._trend.get(topic, Trend.STEADY))
        self._schedule(topic, replace(body, trend=moved), now, immediate=immediate)

    def _private_truth(self, now: float) -> None:
        """Private mode: each pool's inventory for its plan (its counts are taken when
        its next planned release is due)."""
        for (pool, gpu_class), sums in self.tally.pools.items():
            self.schedules.see(pool_topic(pool, gpu_class), sums.hosts, now, self._sized)

    def _private_releases(self, now: float) -> None:
        due = self.schedules.due(now)
        if not due:
            return
        sample = self.sampler or opendp_sampler
        counts = true_counts(self.cfg, self.tally.pools)
        for topic in due:
            # A configuration reloaded since: the new plan, with the spacing it needs.
            self.schedules.check(topic, now, self._sized)
            state = self.schedules.pools[topic]
            if state.next_at > now:
                continue
            plan, truth = state.plan, counts.get(topic)
            charged = truth is not None and self.ledger.charge(
                topic, now, release_epsilon(plan), plan.epsilon_per_day)
            self.schedules.released(topic, now, charged=charged)
            if charged and truth is not None:
                body = private_capacity(truth, plan, sample)
                self._released[topic] = (now, body)
                self._refresh_at[topic] = now + self.cfg.release_interval
                self._capacity_message(topic, body, now, immediate=True)

    def _private_refresh(self, now: float) -> None:
        """``stale_after``: publish each pool's latest release again, widened for its age,
        every ``release_interval`` until the next release (timing and content from what
        was released, the inventory and the clock: no ε)."""
        stale = self.cfg.stale_after
        if stale <= 0:
            return
        for topic, at in list(self._refresh_at.items()):
            if at > now or topic not in self._released:
                continue
            self._refresh_at[topic] = now + self.cfg.release_interval
            when, body = self._released[topic]
            gpus = self.schedules.inventory.get(topic, 0) * self.cfg.host_gpus
            self._capacity_message(topic, aged(body, gpus, now - when, stale), now,
                                   immediate=True)

    def _job_health(self, placement: Placement, hosts: dict[str, HostState],
                    now: float) -> None:
        body = job_health(self.cfg, placement, hosts,
                          self._tuning.get(placement.job, ("default", TuningStatus.STEADY)))
        # The tenant's own members: no other host hides behind this, so no delay.
        self._schedule(job_topic(placement.tenant, placement.job), body, now, immediate=True)

