"""The feed and the measurement: batched observations of each pool, delayed releases,
delivery to tenants' policies, and the ground truth sampled for the leakage attack.

A part of :class:`sim.engine.Simulation` (a mixin): it works on the simulation's
state, set up in ``Simulation.__init__``.
"""

from __future__ import annotations

from controller.types import Publication
from harmonaize.messages import JobAdvisory, JobHealth, PoolCapacity
from sim.events import (
    FLUSH,
    RELEASE,
    SAMPLE,
)


class Observing:
    def _mark(self, pool: int) -> None:
        if not self.flush_pending[pool]:
            self.flush_pending[pool] = True
            self._push(self.now + self.cfg.observe_batch_s, FLUSH, pool)

    def _flush(self, pool: int) -> None:
        self.flush_pending[pool] = False
        pubs = self.feed.flush(pool, self.now, self.state, self.free, self.cong)
        self._deliver(pubs)
        self._plan_release(pool)

    def _release(self, pool: int) -> None:
        self.release_at[pool] = None
        self._deliver(self.feed.release(pool, self.now))
        self._plan_release(pool)

    def _plan_release(self, pool: int) -> None:
        due = self.feed.next_due(pool)
        if due is None:
            return
        planned = self.release_at[pool]
        if planned is None or due < planned:
            self.release_at[pool] = due
            self._push(max(due, self.now), RELEASE, pool)

    def _deliver(self, pubs: list[Publication]) -> None:
        now = self.now
        for pub in pubs:
            body = pub.body
            if pub.tenant is None:
                self.counters["publications_pool"] += 1
                if isinstance(body, PoolCapacity):
                    self._log_attacker(body)
                    if self.negotiator is not None:
                        self._nrelease(body)
                    for policy in self.policies:
                        policy.on_pool(body, now)
                continue
            self.counters["publications_job"] += 1
            owner = self.by_name.get(getattr(body, "job", ""))
            if owner is None or owner.tenant != pub.tenant:
                raise AssertionError(f"{pub.topic} addressed to {pub.tenant}, not the job's owner")
            policy = self.policy_of[pub.tenant]
            if isinstance(body, JobHealth):
                policy.on_job_health(body, now)
            elif isinstance(body, JobAdvisory):
                policy.on_advisory(body, now)

    def _log_attacker(self, cap: PoolCapacity) -> None:
        self.records.feed.append((self.now, self.pool_index[cap.pool], cap.hosts_up.lo,
                                  cap.hosts_up.hi, cap.hosts_down.lo, cap.hosts_down.hi,
                                  cap.gpus_available.lo, cap.gpus_available.hi))

    def _sample(self) -> None:
        me = self.cfg.attacker
        views = self.attacker.views
        for p in self.cluster.pools:
            held = self.held_by[p.index]
            own = held[me]
            view = views.get((p.name, p.gpu_class))
            feature = None if view is None else (view.hosts_up, view.hosts_up_hi,
                                                 view.available, view.available_hi)
            self.records.samples.append((self.now, p.index, sum(held) - own, own, feature))
        if self.probing and self.now % 3600.0 < self.cfg.sample_s:
            self._probe()  # hourly, as the load attack's rows are
        nxt = self.now + self.cfg.sample_s
        if nxt <= self.horizon:
            self._push(nxt, SAMPLE)
