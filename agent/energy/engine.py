"""Sans-I/O energy loop: GPU power limits inside the slowdown a job declared.

Inputs, each with an explicit ``now``: what NVML says of each GPU (its job, limit,
draw, clock, utilisation, and once its power-management range), how far each
GPU's ranks got (the plugin's per-rank collective counts) and every job's
declared :class:`EnergyAllowance` (:meth:`EnergyLoop.step`), and whether a
change was applied (:meth:`applied`, :meth:`failed`). Outputs are actions for
the I/O shell: read a GPU's power range, set a GPU's limit. Nothing here reads
a clock or does I/O.

Per job with a ``max_slowdown`` above 0, on this host's GPUs of it:

1. **Baseline**: the job's progress over one ``window`` at the GPUs' own limits.
   Progress is the collectives its ranks issued per second where every GPU's
   ranks are visible, else the SM clock times utilisation (which assumes every
   step is bound by the clock: it overstates a slowdown, so errs on the job's
   side).
2. **Step**: lower the limit of some GPUs by ``step`` of their own limit, wait
   ``settle`` seconds, measure a window, compare with the baseline. Ranks that
   wait on the others (their collectives ahead of the slowest local rank's in
   ``waiting_share`` of the window's looks) are lowered first: their slack
   costs the job nothing until they become the slowest.
3. **Decide**: a slowdown of at least ``backoff_at`` of the tolerance, or a step
   down that made the job's energy per unit of work (its GPUs' draw over its
   progress) worse by 2% (or ``probe_below`` of the tolerance, if less), raises the
   GPUs lowered last by one step, at once (never rate-limited); below
   ``probe_below`` of it the next step down follows (at most
   ``max_changes_per_minute`` lowerings per GPU); between the two, or with
   nothing left to lower, the limits hold. After ``hold`` seconds held, it tries
   lower again (after a try that had to back off, it holds twice as long before
   the next, up to 16 times); every ``rebaseline`` seconds it measures the
   baseline again and returns to the held limits in one change.

A limit is never set below the tenant's ``min_watts``, the operator's floors
(``min_watts``, ``min_share`` of the GPU's default limit) or NVML's constraint,
nor above the limit the GPU had before (its *original*). Every GPU goes back to
its original when its job leaves it or stops allowing a slowdown, when the GPU
refuses or ignores a change, and on :meth:`stop`; the shell keeps originals on
disk so that a crashed agent's successor restores them.

Energy: the draw is integrated per GPU from the job's start here, and while a
GPU is below its original the energy saved is what the same work would have
cost at the baseline's draw minus what it cost (draw x seconds x the measured
progress ratio).

The loop's half (GPUs' limits, rate limits, restores) is here; the per-job decisions
in :mod:`agent.energy.jobs`, the data in :mod:`agent.energy.types`.
"""

from __future__ import annotations

import math
from collections import deque

from agent.energy.jobs import JobDecisions
from agent.energy.settings import EnergySection
from agent.energy.types import (
    MAX_DT,
    MINUTE,
    RESTORE_RETRY,
    WATT,
    Action,
    EnergyGpu,
    EnergyObservation,
    GpuPower,
    JobPower,
    Phase,
    PowerInfo,
    RankProgress,
    ReadPower,
    SetLimit,
    progress_of,
)
from harmonaize.messages import EnergyAllowance

__all__ = ["Action", "EnergyGpu", "EnergyLoop", "EnergyObservation", "Phase", "PowerInfo",
           "RankProgress", "ReadPower", "SetLimit", "progress_of"]


class EnergyLoop(JobDecisions):
    def __init__(self, cfg: EnergySection) -> None:
        self.cfg = cfg
        self.gpus: dict[str, GpuPower] = {}
        self.jobs: dict[str, JobPower] = {}
        #: When each GPU was last lowered, by UUID. Kept here rather than in its GpuPower state,
        #: which ends with a declaration withdrawn or a job leaving: the operator's rate
        #: limit is about the hardware, so a tenant's re-declaration must not reset it.
        self._lowered: dict[str, deque[float]] = {}
        self._last: float | None = None
        #: This step's progress and (SM clock, utilisation) per GPU.
        self._progress: dict[str, RankProgress] = {}
        self._clocks: dict[str, tuple[int | None, int | None]] = {}

    def configure(self, cfg: EnergySection) -> None:
        self.cfg = cfg

    # --- the interface -------------------------------------------------------------

    def step(self, obs: EnergyObservation, now: float) -> list[Action]:
        dt = 0.0 if self._last is None else min(max(0.0, now - self._last), MAX_DT)
        self._last = now
        actions: list[Action] = []
        seen = {g.uuid: g for g in obs.gpus}
        self._progress = {g.uuid: g.progress for g in obs.gpus if g.progress is not None}
        self._clocks = {g.uuid: (g.sm_clock_mhz, g.util_gpu) for g in obs.gpus}
        for uuid, state in list(self.gpus.items()):
            gpu = seen.get(uuid)
            allowance = obs.jobs.get(state.job)
            if gpu is None or gpu.job != state.job or allowance is None \
                    or allowance.max_slowdown <= 0:
                state.releasing = True
                state.why = ("the GPU is gone" if gpu is None else
                             "the job left the GPU" if gpu.job != state.job else
                             "the job allows no slowdown now")
        for gpu in obs.gpus:
            allowance = obs.jobs.get(gpu.job) if gpu.job else None
            if gpu.uuid not in self.gpus and allowance is not None \
                    and allowance.max_slowdown > 0:
                self.gpus[gpu.uuid] = GpuPower(gpu.index, gpu.uuid, gpu.job or "",
                                           why="reading its power range",
                                           lowered_at=self._lowered_at(gpu.uuid, now))
        for uuid, state in list(self.gpus.items()):
            actions += self._gpu(state, seen.get(uuid), obs.jobs.get(state.job), dt, now)
        for job in sorted({s.job for s in self.gpus.values()} | set(self.jobs)):
            actions += self._job(job, obs.jobs.get(job), now)
        return actions

    def applied(self, action: SetLimit, now: float) -> None:
        state = self.gpus.get(action.uuid)
        if state is None or state.pending != action:
            return
        state.pending = None
        state.retry_at = None
        state.limit_mw = None if action.restore else action.limit_mw
        if action.restore and state.releasing:
            del self.gpus[action.uuid]

    def failed(self, action: SetLimit, error: str, now: float,
               uncertain: bool = False) -> None:
        """A set the GPU refused, or (``uncertain``) that did not return in time and may
        still land: then the GPU is put back to its original as soon as it answers."""
        state = self.gpus.get(action.uuid)
        if state is None or state.pending != action:
            return
        state.pending = None
        if action.restore:
            state.retry_at = now + RESTORE_RETRY
            state.why = f"restoring {action.limit_mw / WATT:g} W failed ({error}): retrying"
            return
        state.unmanaged = state.why = f"setting {action.limit_mw / WATT:g} W failed: {error}"
        if uncertain:
            state.limit_mw = action.limit_mw  # it may land late: restore, retried until done

    def unreadable(self, uuid: str, error: str) -> None:
        """The GPU's power range could not be read: it is left alone."""
        state = self.gpus.get(uuid)
        if state is not None and state.power is None:
            state.unmanaged = state.why = f"its power range cannot be read: {error}"

    def stop(self) -> list[SetLimit]:
        """Every GPU this loop changed, back to its original (the agent stops)."""
        out = []
        for state in self.gpus.values():
            if state.power is not None and (state.limit_mw is not None
                                            or state.pending is not None):
                state.releasing = True
                out.append(self._restore(state, "the agent stops"))
        return out

    def next_deadline(self) -> float | None:
        times: list[float] = []
        for job in self.jobs.values():
            if job.phase is Phase.SETTLE:
                times.append(job.since + self.cfg.settle)
            else:
                times.append(job.window_start + self.cfg.window)
        times += [s.retry_at for s in self.gpus.values() if s.retry_at is not None]
        return min(times, default=None)

    def report(self) -> dict[str, tuple[float, float]]:
        """Per job: energy its GPUs here used since it started here, and saved (joules)."""
        out: dict[str, tuple[float, float]] = {}
        for state in self.gpus.values():
            used, saved = out.get(state.job, (0.0, 0.0))
            out[state.job] = (used + state.used_j, saved + state.saved_j)
        return out

    # --- one GPU -------------------------------------------------------------------

    def _gpu(self, state: GpuPower, gpu: EnergyGpu | None, allowance: EnergyAllowance | None,
             dt: float, now: float) -> list[Action]:
        if gpu is not None:
            state.index = gpu.index
            state.observed_mw = gpu.limit_mw
            state.draw_w = None if gpu.draw_mw is None else gpu.draw_mw / WATT
            if state.draw_w is not None:
                state.used_j += state.draw_w * dt
                job = self.jobs.get(state.job)
                if state.limit_mw is not None and state.baseline_w is not None and job:
                    ratio = min(max(job.ratio if job.ratio is not None else 1.0, 0.0), 1.5)
                    state.saved_j += (state.baseline_w * ratio - state.draw_w) * dt
        if state.power is None:
            if gpu is not None and gpu.power is not None:
                self._take(state, gpu.power, allowance)
            elif state.releasing:
                del self.gpus[state.uuid]  # never touched
                return []
            elif not state.read_asked and gpu is not None:
                state.read_asked = True
                return [ReadPower(state.index, state.uuid)]
            return []
        if state.pending is not None:
            return []
        if state.retry_at is not None and now < state.retry_at:
            return []
        if state.releasing or state.unmanaged:
            if state.limit_mw is None:
                if state.releasing:
                    del self.gpus[state.uuid]
                return []
            return [self._restore(state, state.why)]
        if allowance is not None:
            lo = self._floor(state.power, allowance)
            if lo != state.lo_mw:
                state.lo_mw = lo
                if state.limit_mw is not None and state.limit_mw < lo:
                    return [self._set(state, lo, "the floor rose", now, lowering=False)]
        return []

    def _take(self, state: GpuPower, power: PowerInfo, allowance: EnergyAllowance | None) -> None:
        state.power = power
        state.lo_mw = self._floor(power, allowance)
        high = min(power.original_mw, power.max_mw)
        if state.lo_mw + self._step(state) > high:
            state.unmanaged = state.why = (
                f"no room: its bounds leave {state.lo_mw / WATT:g}-{high / WATT:g} W")
        else:
            state.why = "managed"

    def _floor(self, power: PowerInfo, allowance: EnergyAllowance | None) -> int:
        tenant = allowance.min_watts * WATT if allowance is not None else 0.0
        floor = max(power.min_mw, self.cfg.min_watts * WATT,
                    self.cfg.min_share * power.default_mw, tenant)
        # Whole watts, rounded up (never below a floor; a float's last bit is not a watt).
        return math.ceil(floor / WATT - 1e-9) * WATT

    def _step(self, state: GpuPower) -> int:
        return max(WATT, round(self.cfg.step * state.original_mw / WATT) * WATT)

    def _restore(self, state: GpuPower, why: str) -> SetLimit:
        action = SetLimit(state.index, state.uuid, state.original_mw, state.original_mw, True,
                          why)
        state.pending = action
        return action

    def _set(self, state: GpuPower, limit_mw: int, why: str, now: float,
             lowering: bool) -> SetLimit:
        high = min(state.original_mw, state.power.max_mw if state.power else limit_mw)
        limit_mw = max(state.lo_mw, min(limit_mw, high))
        if limit_mw >= state.original_mw:
            return self._restore(state, why)
        if lowering:
            state.lowered_at.append(now)
        action = SetLimit(state.index, state.uuid, limit_mw, state.original_mw, False, why)
        state.pending = action
        return action

    def _lowered_at(self, uuid: str, now: float) -> deque[float]:
        """The GPU's lowerings in the last minute, shared by every state it gets."""
        for key, times in list(self._lowered.items()):
            while times and now - times[0] >= MINUTE:
                times.popleft()
            if not times and key not in self.gpus:
                del self._lowered[key]  # bounded: only GPUs lowered within the minute stay
        return self._lowered.setdefault(uuid, deque())

    def _may_lower(self, state: GpuPower, now: float) -> float | None:
        """None if the GPU may be lowered now, else when it may."""
        while state.lowered_at and now - state.lowered_at[0] >= MINUTE:
            state.lowered_at.popleft()
        if len(state.lowered_at) < self.cfg.max_changes_per_minute:
            return None
        return state.lowered_at[0] + MINUTE
