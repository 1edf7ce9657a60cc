"""What tenants may ask (:class:`sim.policies.Actions`): resize an elastic job, checkpoint
on an advisory, replace a degraded member, switch the collective algorithm.

A part of :class:`sim.engine.Simulation` (a mixin): it works on the simulation's
state, set up in ``Simulation.__init__``.
"""

from __future__ import annotations

from sim.jobs import RUNNING, Job
from sim.policies import JobView


class TenantActions:
    def resize(self, job: JobView, gpus: int, now: float) -> bool:
        j = self.by_name[job.name]
        if j.state != RUNNING or gpus == j.g or not j.lo_g <= gpus <= j.hi_g:
            return False
        if gpus > j.g and (self.queue[j.pool] or self.holds_in[j.pool]):
            return False  # waiting jobs and holds come first
        return self._resize(j, gpus, forced=False)

    def _resize(self, j: Job, gpus: int, forced: bool) -> bool:
        """Restart ``j`` on ``gpus`` GPUs; forced: a reclaim (the caller reschedules the pool)."""
        nodes, per, old = j.nodes, j.per, j.g
        self._advance(j, self.now)
        self._give(j)
        spot = self._find(j.pool, gpus)
        if spot is None:
            if gpus > j.g:  # no room to grow: put it back as it was
                self._take(j, nodes, per)
                return False
            # Shrinking onto hosts it cannot stay on (drained): start over from the queue.
            self._kill_released(j, "preempt" if forced else "rescale")
            if not forced:
                self._schedule(j.pool)
            return True
        if forced:
            self.rollback["preempt"] += (j.P - j.S) * j.n
            j.P = j.S
            pause, cause = self.cfg.restart_cost, "preempt"
        else:
            j.S = j.P  # a graceful resize checkpoints first
            pause, cause = self.cfg.ckpt_cost + self.cfg.rescale_cost, "rescale"
        self.policies[j.tenant_idx].stopped(j)
        if self.feed.active:
            self.feed.remove(j.pool, j.name)
        j.g = gpus
        j.last_resize = self.now
        self._start(j, spot, pause, cause)
        if gpus < old and not forced:
            self._schedule(j.pool)
        return True

    def _kill_released(self, j: Job, cause: str) -> None:
        if cause == "preempt":
            self.rollback[cause] += (j.P - j.S) * j.n
            j.P = j.S
        else:
            j.S = j.P
        self.grown[j.pool].pop(j.index, None)
        if self.feed.active:
            self.feed.remove(j.pool, j.name)
        self.policies[j.tenant_idx].stopped(j)
        self._requeue_front(j, cause)

    def checkpoint(self, job: JobView, now: float) -> bool:
        j = self.by_name[job.name]
        if j.state != RUNNING:
            return False
        self._advance(j, self.now)
        if j.pause_until > self.now or j.phase >= self.I:
            return False  # already restarting or checkpointing
        j.pending_save = j.P
        j.pause_until = self.now + self.cfg.ckpt_cost
        j.phase = 0.0
        self.pauses["advisory-ckpt"] += j.alloc * self.cfg.ckpt_cost
        self._schedule_finish(j)
        return True

    def replace(self, job: JobView, now: float) -> bool:
        j = self.by_name[job.name]
        if j.state != RUNNING or not j.degraded:
            return False
        nodes, per = j.nodes, j.per
        self._advance(j, self.now)
        self._give(j)
        spot = self._find(j.pool, j.g)
        if spot is None:
            self._take(j, nodes, per)
            return False
        j.S = j.P
        self.policies[j.tenant_idx].stopped(j)
        if self.feed.active:
            self.feed.remove(j.pool, j.name)
        self._start(j, spot, self.cfg.ckpt_cost + self.cfg.restart_cost, "replace")
        return True

    def set_algorithm(self, job: JobView, algorithm: int, now: float) -> None:
        j = self.by_name[job.name]
        if j.state != RUNNING or j.algo == algorithm:
            return
        j.algo = algorithm
        if len(j.nodes) > 1:  # only collectives across hosts feel the network
            self.counters["algorithm_switches"] += 1
            self._rerate(j)
