"""Faults and congestion: a node's state as faults start and end, the agent's advisory
before a fault (a precursor), and congestion episodes per rack.

A part of :class:`sim.engine.Simulation` (a mixin): it works on the simulation's
state, set up in ``Simulation.__init__``.
"""

from __future__ import annotations

from sim.events import (
    CONG_END,
    FAULT_END,
)
from sim.feed import DEGRADED, DOWN, UP, member_name
from sim.jobs import Job
from sim.model import HIGH, LOW, NO_CONGESTION


class Hazards:
    def _node_state(self, n: int) -> int:
        return DOWN if self.hard[n] else DEGRADED if self.soft[n] else UP

    def _fault(self, index: int, delta: int) -> None:
        f = self.faults[index]
        n = f.node
        if delta > 0:
            self.counters["faults"] += 1
            self._push(f.end, FAULT_END, index)
        if f.soft:
            self.soft[n] += delta
        else:
            self.hard[n] += delta
        before, after = self.state[n], self._node_state(n)
        if before == after:
            return
        pool = self.node_pool[n]
        if before == UP:
            self.free_sets[pool][self.free[n]].discard(n)
            self.pool_free[pool] -= self.free[n]
            self.records.failures[pool].append(self.now)
        self.state[n] = after
        if after == DOWN:
            self._tick(self.now)
            self.cap_now -= self.gpn
            for j in list(self.node_jobs[n].values()):
                self.counters["fault_kills"] += 1
                self._kill(j, "fault")
        elif before == DOWN:
            self._tick(self.now)
            self.cap_now += self.gpn
        if after == UP:
            self.free_sets[pool][self.free[n]].add(n)
            self.pool_free[pool] += self.free[n]
        if self.maintaining and after == DEGRADED and before == UP:
            self._notice(n, f.desc)
        if (after == DEGRADED) != (before == DEGRADED):
            step = 1 if after == DEGRADED else -1
            for j in list(self.node_jobs[n].values()):
                j.degraded += step
                self._rerate(j)
        if self.feed.active:
            self.feed.node_changed(n, True, (j.name for j in self.node_jobs[n].values()))
            self._mark(pool)
        self._schedule(pool)

    def _precursor(self, index: int) -> None:
        f = self.faults[index]
        self.counters["precursors"] += 1
        if not self.feed.active or self.state[f.node] == DOWN:
            return
        pool = self.node_pool[f.node]
        for j in list(self.node_jobs[f.node].values()):
            ranks = tuple(member_name(i) for i, n in enumerate(j.nodes) if n == f.node)
            self.feed.advisory(pool, j.name, f.node, ranks, self.now)
            self.counters["advisories_sent"] += 1
        self._deliver(self.feed.release(pool, self.now))
        self._plan_release(pool)

    def _congestion(self, index: int, starting: bool) -> None:
        episode = self.episodes[index]
        step = 1 if starting else -1
        if starting:
            self._push(episode.end, CONG_END, index)
        touched: dict[int, Job] = {}
        for n in episode.nodes:
            active = self.cong_active[n]
            active[episode.level] += step
            level = HIGH if active[HIGH] else LOW if active[LOW] else NO_CONGESTION
            if level == self.cong[n]:
                continue
            self.cong[n] = level
            touched.update(self.node_jobs[n])
            if self.feed.active:
                self.feed.node_changed(n, True, (j.name for j in self.node_jobs[n].values()))
                self._mark(self.node_pool[n])
        for j in touched.values():
            if len(j.nodes) > 1:
                self._rerate(j)
