"""Where jobs run: finding room for a job, taking and giving back nodes' GPUs (with the
pool's free sets and the accounting), and starting or stopping a job on its nodes.

A part of :class:`sim.engine.Simulation` (a mixin): it works on the simulation's
state, set up in ``Simulation.__init__``.
"""

from __future__ import annotations

import itertools

from sim.feed import DEGRADED, UP
from sim.jobs import RUNNING, Job
from sim.model import RING


class Placement:
    def _find(self, pool: int, g: int) -> tuple[list[int], int] | None:
        gpn = self.gpn
        sets = self.free_sets[pool]
        if g <= gpn:
            for k in range(g, gpn + 1):
                s = sets[k]
                if s:
                    return [next(iter(s))], g
            return None
        m = -(-g // gpn)
        whole = sets[gpn]
        if len(whole) < m:
            return None
        return list(itertools.islice(whole, m)), gpn

    def _take(self, j: Job, nodes: list[int], per: int) -> None:
        self._tick(self.now)
        pool = j.pool
        sets = self.free_sets[pool]
        feed = self.feed.active
        for n in nodes:
            before = self.free[n]
            if before < per:
                raise AssertionError(f"node {n} over-committed: {per} > {before} free")
            self.free[n] = before - per
            if self.state[n] == UP:
                sets[before].discard(n)
                sets[before - per].add(n)
                self.pool_free[pool] -= per
            self.node_jobs[n][j.index] = j
            if feed:
                self.feed.node_changed(n, False)
        j.nodes, j.per = nodes, per
        j.alloc = per * len(nodes)
        self.alloc_now += j.alloc
        self.held_by[pool][j.tenant_idx] += j.alloc
        j.alloc_since = self.now
        if feed:
            self._mark(pool)

    def _give(self, j: Job) -> None:
        self._tick(self.now)
        pool = j.pool
        sets = self.free_sets[pool]
        feed = self.feed.active
        per = j.per
        for n in j.nodes:
            before = self.free[n]
            self.free[n] = before + per
            if self.state[n] == UP:
                sets[before].discard(n)
                sets[before + per].add(n)
                self.pool_free[pool] += per
            del self.node_jobs[n][j.index]
            if feed:
                self.feed.node_changed(n, False)
        self.alloc_now -= j.alloc
        self.held_by[pool][j.tenant_idx] -= j.alloc
        held = self.now - j.alloc_since
        j.alloc_gpu_s += j.alloc * held
        if j.watts:  # energy runs (sim/energy.py): full power until the loop settles
            j.energy += j.alloc * j.watts * (min(held, j.conv) + max(0.0, held - j.conv) * j.pw)
        j.nodes, j.per, j.alloc = [], 0, 0
        if feed:
            self._mark(pool)

    def _start(self, j: Job, spot: tuple[list[int], int], pause: float, cause: str) -> None:
        """Put ``j`` on ``spot`` and let it run after ``pause`` seconds (charged to ``cause``)."""
        now = self.now
        nodes, per = spot
        self._take(j, nodes, per)
        j.state = RUNNING
        j.t0 = now
        j.pause_until = now + pause
        j.phase = 0.0
        j.pending_save = -1.0
        if j.first_start < 0:
            j.first_start = now
        j.degraded = sum(1 for n in nodes if self.state[n] == DEGRADED)
        j.rate = self._rate(j)
        self._schedule_finish(j)
        if pause > 0 and cause:
            self.pauses[cause] += j.alloc * pause
        if j.g > j.n:
            self.grown[j.pool][j.index] = j
        else:
            self.grown[j.pool].pop(j.index, None)
        if self.feed.active:
            # The redactor's first health message for a placement says "all clear" unless a
            # host is congested or unhealthy; the tenant only acts on it if it set another
            # algorithm before. Skipping it otherwise changes nothing (see sim.feed).
            watch = j.algo != RING or any(self.cong[n] or self.state[n] != UP for n in nodes)
            self.feed.place(j.pool, j.name, j.tenant, nodes, watch)
        self.policies[j.tenant_idx].started(j)
        if self.hold_of and j.index in self.hold_of:
            self._hold_started(j)

    def _stop(self, j: Job) -> None:
        """Take ``j`` off its hosts (it finishes, or waits to restart)."""
        self._give(j)
        self.grown[j.pool].pop(j.index, None)
        if self.feed.active:
            self.feed.remove(j.pool, j.name)
        self.policies[j.tenant_idx].stopped(j)
