"""A job's state and its progress between events, in closed form.

A running job alternates ``I`` seconds of computing with a checkpoint that takes ``T - I``
seconds; progress is saved when a checkpoint completes. Its position in that cycle
(``phase``) and its rate give progress at any later time, and the time it completes, with
no events in between. A pause (a restart, a resize, an extra checkpoint) delays all of
that; an extra checkpoint's save lands when its pause ends.
"""

from __future__ import annotations

import math

from sim.model import RING
from sim.traces import JobSpec

WAITING, QUEUED, RUNNING, DONE, REJECTED = range(5)


class Job:
    """One job's mutable state. Satisfies :class:`sim.policies.JobView`."""

    __slots__ = (
        "P", "S", "algo", "alloc", "alloc_gpu_s", "alloc_since", "arrival", "conv", "degraded",
        "elastic", "energy", "finish", "first_start", "g", "gpu_class", "hi_g", "index",
        "kills", "last_resize", "lo_g", "n", "name", "nodes", "pause_until", "pending_save",
        "per", "phase", "pool", "pool_name", "pw", "rate", "restart", "state", "t0", "tenant",
        "tenant_idx", "thr", "version", "watts", "work", "workload",
    )

    def __init__(self, spec: JobSpec, index: int, *, pool: int, pool_name: str,
                 gpu_class: str, tenant_idx: int, tenant: str, elastic: bool, lo_g: int,
                 hi_g: int) -> None:
        self.index = index  # position in the engine's job list
        self.name = f"job-{index}"
        self.tenant, self.tenant_idx = tenant, tenant_idx
        self.pool, self.pool_name, self.gpu_class = pool, pool_name, gpu_class
        self.arrival, self.work, self.n = spec.arrival, spec.duration, spec.gpus
        self.elastic, self.lo_g, self.hi_g = elastic, lo_g, hi_g
        self.g = spec.gpus
        self.nodes: list[int] = []
        self.per = 0            # GPUs used on each of its nodes
        self.alloc = 0          # GPUs held
        self.state = WAITING
        self.P = self.S = 0.0   # progress and saved progress, in work seconds
        self.t0 = 0.0           # time P and phase refer to
        self.phase = 0.0        # position in the compute/checkpoint cycle (after any pause)
        self.pause_until = 0.0  # no progress before this
        self.pending_save = -1.0  # progress an ongoing extra checkpoint will save
        self.rate = 1.0
        self.version = 0
        self.algo = RING
        self.degraded = 0       # members on degraded hosts
        self.first_start = -1.0
        self.finish = -1.0
        self.last_resize = -math.inf
        self.restart = ""       # cause of the pause the next start begins with
        self.alloc_since = 0.0
        self.alloc_gpu_s = 0.0
        self.kills = 0
        # Power limits inside the tenant's slack (sim/energy.py); 0 W: not simulated.
        self.thr = 1.0          # compute speed at the settled limit
        self.pw = 1.0           # power there, relative to the GPU's own limit
        self.conv = 0.0         # seconds of each run at full power before it settles
        self.watts = 0.0        # the workload's measured power per GPU at its own limit
        self.energy = 0.0       # joules over finished runs on its GPUs
        self.workload = ""

    @property
    def running(self) -> bool:
        return self.state == RUNNING




def computed(y: float, interval: float, cycle: float) -> float:
    """Compute seconds within cycle positions [0, y)."""
    cycles, rem = divmod(y, cycle)
    return cycles * interval + min(rem, interval)


def advance(j: Job, t: float, interval: float, cycle: float) -> None:
    """Bring ``j``'s progress, saved progress and phase to time ``t``."""
    if t <= j.t0:
        return
    start = j.t0
    if j.pause_until > start:
        if t <= j.pause_until:
            j.t0 = t
            return
        start = j.pause_until
        if j.pending_save >= 0.0:
            j.S = j.pending_save
            j.pending_save = -1.0
    a = j.phase
    y = a + (t - start)
    fa = computed(a, interval, cycle)
    k = math.floor(y / cycle)
    if k >= 1:  # checkpoints completed on the way: the last one saved its progress
        j.S = j.P + j.rate * (k * interval - fa)
    j.P += j.rate * (computed(y, interval, cycle) - fa)
    j.phase = y - k * cycle
    j.t0 = t


def finish_time(j: Job, interval: float, cycle: float) -> float:
    """When ``j`` completes if nothing changes (no checkpoint is taken at the very end)."""
    start = max(j.t0, j.pause_until)
    remaining = j.work - j.P
    if remaining <= 1e-9:
        return start
    a = j.phase
    target = computed(a, interval, cycle) + remaining / j.rate
    k = math.floor(target / interval)
    rem = target - k * interval
    y = (k - 1) * cycle + interval if rem <= 1e-9 and k >= 1 else k * cycle + rem
    return start + (y - a)
