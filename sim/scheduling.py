"""The provider's scheduler: arrivals, FIFO with backfill per pool, reclaiming
opportunistic GPUs when jobs wait, completions, and kills back to the last checkpoint.

A part of :class:`sim.engine.Simulation` (a mixin): it works on the simulation's
state, set up in ``Simulation.__init__``.
"""

from __future__ import annotations

from sim.cluster import allocation
from sim.jobs import DONE, QUEUED, REJECTED, Job


class Scheduling:
    def _arrive(self, j: Job) -> None:
        pool = self.cluster.pools[j.pool]
        if allocation(j.n, self.gpn) > pool.nodes * self.gpn:
            j.state = REJECTED  # it can never fit this pool
            self.counters["rejected"] += 1
            self.unresolved -= 1
            return
        j.g = self.policies[j.tenant_idx].submit_size(j)
        j.state = QUEUED
        if self.hold_of and self._front(j):
            self.queue[j.pool].insert(0, j)  # it comes to claim its hold
        else:
            self.queue[j.pool].append(j)
        self._schedule(j.pool)

    def _schedule(self, pool: int) -> None:
        queue = self.queue[pool]
        while queue:
            if self.pool_free[pool] > 0:
                keep: list[Job] = []
                started = False
                depth = self.cfg.backfill_depth
                for i, j in enumerate(queue):
                    if i >= depth or self.pool_free[pool] == 0:
                        keep.extend(queue[i:])
                        break
                    spot = self._find(pool, j.g)
                    if spot is None or (self.holds_in[pool] and not self._may_take(j, spot)):
                        keep.append(j)
                        continue
                    pause, cause = (self.cfg.restart_cost, j.restart) if j.restart else (0.0, "")
                    j.restart = ""
                    self._start(j, spot, pause, cause)
                    started = True
                if started:
                    self.queue[pool] = queue = keep
            grown = self.grown[pool]
            if not queue or not grown:
                return
            # Jobs wait: reclaim the newest opportunistic GPUs, then look again.
            victim = grown[next(reversed(grown))]
            self.counters["reclaims"] += 1
            self._resize(victim, victim.n, forced=True)

    def _requeue_front(self, j: Job, cause: str) -> None:
        j.state = QUEUED
        j.restart = cause
        j.g = min(j.g, j.n)  # the opportunistic part is gone with the allocation
        self.queue[j.pool].insert(0, j)

    def _finish(self, j: Job) -> None:
        self._advance(j, self.now)
        j.P = j.work
        j.state = DONE
        j.finish = self.now
        self._stop(j)
        self.unresolved -= 1
        self._schedule(j.pool)

    def _kill(self, j: Job, cause: str) -> None:
        """The job's host failed (or its GPUs were reclaimed): back to its last checkpoint."""
        self._advance(j, self.now)
        lost = j.P - j.S
        self.rollback[cause] += lost * j.n
        j.P = j.S
        j.pending_save = -1.0
        j.kills += 1
        self._stop(j)
        self._requeue_front(j, cause)
