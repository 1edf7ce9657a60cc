"""The bridge from simulated hosts and jobs to the controller's real :class:`Redactor`.

The simulator never decides what a tenant may see: it hands the redactor what the
controller would have (every host's :class:`HostState`, every job's :class:`Placement`,
agents' :class:`JobAdvisory` s) with the simulation clock as its time, and delivers only
what :meth:`Redactor.due` releases.

Two things keep this fast without changing what comes out:

* One redactor per pool. Pool aggregates, trends and release times are per topic, and a
  job lives in one pool, so this is the controller's redactor with its work split; each
  gets its own seeded RNG for the release jitter and its own seeded noise (the private
  mode's distribution, from :func:`controller.privacy.seeded_sampler`, so a run comes
  out the same from its seed; the controller samples with OpenDP). Every host of the
  pool is handed over at every observation, up or down, so each redactor sizes its pool's
  release plan from the pool's whole inventory, as the controller does.
* ``Redactor.observe`` recomputes every placement's job health unless told which jobs to
  look at. Only jobs on a host whose health, liveness or links changed can have new
  health, so the bridge passes just those (plus new placements whose first health
  message would tell the tenant something: a host congested or unhealthy, or a tenant
  that had switched its collective algorithm and would switch back on "all clear"). A
  job's health from a host whose only change was how many GPUs are in use would be
  identical, and the redactor publishes nothing for an unchanged condition anyway.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

from controller.privacy import seeded_sampler
from controller.redaction import Redactor
from controller.redactionconfig import Mode, RedactionConfig
from controller.types import HostState, Member, Placement, Publication
from harmonaize.messages import (
    Advice,
    GpuCounts,
    Health,
    JobAdvisory,
    Level,
    LinkHealth,
    Urgency,
)
from sim.cluster import Cluster

#: Node states in the engine.
UP, DEGRADED, DOWN = 0, 1, 2
_LEVELS = (Level.NONE, Level.LOW, Level.HIGH)
_LINKS = tuple((LinkHealth("data", 1, 0, level, Level.NONE),) for level in _LEVELS)


def member_name(i: int) -> str:
    """A job's members in the tenant's own terms: its workers, in order."""
    return f"worker-{i}"


class FeedBridge:
    def __init__(self, cluster: Cluster, rcfg: RedactionConfig, seed: int) -> None:
        self.cluster = cluster
        self.mode = rcfg.mode
        self.active = rcfg.mode is not Mode.NONE
        self.redactors = [Redactor(cfg=rcfg, rng=random.Random(f"{seed}:redactor:{p.name}"),
                                   sampler=seeded_sampler(f"{seed}:noise:{p.name}"))
                          for p in cluster.pools]
        self.node_pool = [0] * cluster.node_count
        for p in cluster.pools:
            for n in p.node_range:
                self.node_pool[n] = p.index
        self._hosts: list[HostState | None] = [None] * cluster.node_count
        self._dirty: list[set[int]] = [set() for _ in cluster.pools]
        self._health_jobs: list[set[str]] = [set() for _ in cluster.pools]
        self._gpus: dict[tuple[int, int], GpuCounts] = {}
        self.observations = 0

    # --- inputs from the engine ---------------------------------------------------------

    def node_changed(self, node: int, health: bool, jobs: Iterable[str] = ()) -> None:
        """A host's state changed; ``health``: more than its GPUs in use (``jobs`` on it)."""
        pool = self.node_pool[node]
        self._dirty[pool].add(node)
        if health:
            self._health_jobs[pool].update(jobs)

    def place(self, pool: int, job: str, tenant: str, nodes: Iterable[int],
              watch: bool) -> None:
        """A job (re)started on ``nodes``; ``watch``: one of them is not plainly healthy."""
        members = tuple(Member(member_name(i), self.cluster.host_name(n))
                        for i, n in enumerate(nodes))
        self.redactors[pool].place(Placement(job, tenant, members))
        if watch:
            self._health_jobs[pool].add(job)

    def remove(self, pool: int, job: str) -> None:
        self.redactors[pool].remove_job(job)
        self._health_jobs[pool].discard(job)

    def advisory(self, pool: int, job: str, node: int, ranks: tuple[str, ...],
                 now: float) -> None:
        """Checkpoint advice from ``node``'s agent for its ranks of ``job``."""
        self.redactors[pool].advisory(
            self.cluster.host_name(node),
            JobAdvisory(job, Advice.CHECKPOINT_NOW, "gpu-failure", Urgency.HIGH, ranks),
            now, now)

    # --- observation and release ----------------------------------------------------------

    def flush(self, pool: int, now: float, state: list[int], free: list[int],
              congestion: list[int]) -> list[Publication]:
        """Tell the pool's redactor its hosts' current states; return what is due now."""
        red = self.redactors[pool]
        per_node = self.cluster.gpus_per_node
        for node in self._dirty[pool]:
            self._hosts[node] = self._host(node, state[node], per_node - free[node],
                                           congestion[node])
        self._dirty[pool].clear()
        p = self.cluster.pools[pool]
        hosts = [h for n in p.node_range if (h := self._hosts[n]) is not None]
        wanted = self._health_jobs[pool]
        red.observe(hosts, now, jobs=sorted(wanted))
        wanted.clear()
        self.observations += 1
        return red.due(now)

    def release(self, pool: int, now: float) -> list[Publication]:
        return self.redactors[pool].due(now)

    def next_due(self, pool: int) -> float | None:
        return self.redactors[pool].next_due()

    def prime(self, state: list[int], free: list[int], congestion: list[int]) -> None:
        """Build every host's state once, before the first observation."""
        per_node = self.cluster.gpus_per_node
        for n in range(self.cluster.node_count):
            self._hosts[n] = self._host(n, state[n], per_node - free[n], congestion[n])

    def _host(self, node: int, state: int, in_use: int, congestion: int) -> HostState:
        per_node = self.cluster.gpus_per_node
        p = self.cluster.pools[self.node_pool[node]]
        gpus = self._counts(0, 0) if state == DOWN else self._counts(per_node, in_use)
        return HostState(
            host_id=self.cluster.host_name(node), pool=p.name, gpu_class=p.gpu_class,
            alive=state != DOWN, schedulable=state == UP,
            health=(Health.HEALTHY, Health.DEGRADED, Health.UNHEALTHY)[state],
            gpus=gpus, links=_LINKS[congestion])

    def _counts(self, healthy: int, in_use: int) -> GpuCounts:
        key = (healthy, in_use)
        counts = self._gpus.get(key)
        if counts is None:
            lost = self.cluster.gpus_per_node - healthy
            counts = self._gpus[key] = GpuCounts(healthy=healthy, lost=lost, in_use=in_use)
        return counts
