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
"""

# Over 400 lines because a job's phases, its GPUs' limits, the back-off and the restores
# are one state machine over the same state; the types it reads and emits are with it.

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from agent.energy.settings import EnergySection
from agent.plugin.layout import StatsSlot
from harmonaize.messages import EnergyAllowance

WATT = 1000  # milliwatts
#: The longest gap between two looks counted toward energy (a stalled agent says nothing).
MAX_DT = 10.0
#: Rate limit window for lowerings, seconds.
MINUTE = 60.0
#: Seconds between retries of a restore that failed.
RESTORE_RETRY = 10.0
#: A hold grows to at most this many times ``hold`` after tries lower that failed.
MAX_HOLD_SCALE = 16.0
#: A step down that raises energy per unit of work by this share (or by probe_below of
#: the tolerance, if less) is undone.
WORSE = 0.02


@dataclass(frozen=True)
class PowerInfo:
    """A GPU's power-management range, and the limit every restore returns it to."""

    min_mw: int
    max_mw: int
    default_mw: int
    original_mw: int


@dataclass(frozen=True)
class RankProgress:
    """How far the ranks on one GPU got: their collectives, summed, and which processes'
    (``key``; another key is another set of processes, not progress)."""

    collectives: int
    key: int
    #: Ahead of the slowest local rank of each communicator they share (None: no
    #: communicator with another local rank to compare with).
    ahead: bool | None = None


@dataclass(frozen=True)
class EnergyGpu:
    index: int
    uuid: str
    job: str | None = None
    limit_mw: int | None = None
    draw_mw: int | None = None
    sm_clock_mhz: int | None = None
    util_gpu: int | None = None
    power: PowerInfo | None = None
    progress: RankProgress | None = None


@dataclass(frozen=True)
class EnergyObservation:
    gpus: tuple[EnergyGpu, ...] = ()
    #: Declared jobs' allowances, by job.
    jobs: Mapping[str, EnergyAllowance] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadPower:
    """Read the GPU's power range and current limit (the shell answers in the next
    observation's ``power``)."""

    index: int
    uuid: str


@dataclass(frozen=True)
class SetLimit:
    index: int
    uuid: str
    limit_mw: int
    original_mw: int
    #: Back to the original (the shell forgets the saved original once it is applied).
    restore: bool
    why: str


Action = ReadPower | SetLimit


class Phase(StrEnum):
    BASELINE = "baseline"  # progress at the GPUs' own limits
    SETTLE = "settle"      # a change was made: clocks and the job settle
    MEASURE = "measure"    # what the change costs
    HOLD = "hold"          # settled, still watched


@dataclass
class _Gpu:
    index: int
    uuid: str
    job: str
    power: PowerInfo | None = None
    lo_mw: int = 0
    #: The limit this loop set; None: the original (untouched or restored).
    limit_mw: int | None = None
    pending: SetLimit | None = None
    unmanaged: str = ""
    releasing: bool = False
    read_asked: bool = False
    retry_at: float | None = None
    lowered_at: deque[float] = field(default_factory=deque)
    used_j: float = 0.0
    saved_j: float = 0.0
    baseline_w: float | None = None
    draw_w: float | None = None
    observed_mw: int | None = None
    draw_sum: float = 0.0
    draw_n: int = 0
    ahead_n: int = 0
    looks_n: int = 0
    waiting: bool = False
    why: str = ""

    @property
    def original_mw(self) -> int:
        assert self.power is not None
        return self.power.original_mw

    @property
    def current_mw(self) -> int:
        return self.original_mw if self.limit_mw is None else self.limit_mw


@dataclass
class _Job:
    allowance: EnergyAllowance
    gpus: tuple[str, ...] = ()
    phase: Phase = Phase.BASELINE
    since: float = 0.0
    window_start: float = 0.0
    start: dict[str, tuple[int, int]] = field(default_factory=dict)
    proxy_sum: float = 0.0
    proxy_n: int = 0
    baseline: float | None = None
    source: str = ""
    baseline_at: float = 0.0
    ratio: float | None = None
    slowdown: float | None = None
    settled: dict[str, bool] = field(default_factory=dict)
    #: The GPUs lowered last and their group ("waiting", "critical"): a back-off raises them.
    last: tuple[str, ...] = ()
    last_group: str = ""
    #: Limits held before a new baseline, to return to in one change.
    held: dict[str, int] = field(default_factory=dict)
    #: A step down after a hold is being tried; each failed try doubles the next hold.
    retrying: bool = False
    hold_scale: float = 1.0
    #: Watts per unit of progress (the job's GPUs' mean draw over its rate) in the last
    #: window, and before the last step down (None: the last change was no step down).
    efficiency: float | None = None
    before: float | None = None
    why: str = "measuring the job's progress at its GPUs' own limits"


def progress_of(slots: Iterable[StatsSlot], pids: Mapping[int, int]) -> dict[int, RankProgress]:
    """Per GPU index, its ranks' progress from the job's stats slots (``pids``: process ->
    GPU). A GPU's ranks are *ahead* when, in every communicator they share with another
    local rank, each has issued more collectives than the slowest local rank of it."""
    slots = [s for s in slots if s.pid in pids]
    lowest: dict[int, int] = {}
    members: dict[int, int] = {}
    for s in slots:
        lowest[s.comm_id] = min(lowest.get(s.comm_id, s.collectives), s.collectives)
        members[s.comm_id] = members.get(s.comm_id, 0) + 1
    out: dict[int, RankProgress] = {}
    by_gpu: dict[int, list[StatsSlot]] = {}
    for s in slots:
        by_gpu.setdefault(pids[s.pid], []).append(s)
    for gpu, own in by_gpu.items():
        shared = [s for s in own if members[s.comm_id] > 1]
        ahead = all(s.collectives > lowest[s.comm_id] for s in shared) if shared else None
        key = hash(tuple(sorted(s.key for s in own))) & 0x7FFFFFFFFFFFFFFF
        out[gpu] = RankProgress(sum(s.collectives for s in own), key, ahead)
    return out


class EnergyLoop:
    def __init__(self, cfg: EnergySection) -> None:
        self.cfg = cfg
        self.gpus: dict[str, _Gpu] = {}
        self.jobs: dict[str, _Job] = {}
        #: When each GPU was last lowered, by UUID. Kept here rather than in its _Gpu state,
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
                self.gpus[gpu.uuid] = _Gpu(gpu.index, gpu.uuid, gpu.job or "",
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

    def _gpu(self, state: _Gpu, gpu: EnergyGpu | None, allowance: EnergyAllowance | None,
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

    def _take(self, state: _Gpu, power: PowerInfo, allowance: EnergyAllowance | None) -> None:
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

    def _step(self, state: _Gpu) -> int:
        return max(WATT, round(self.cfg.step * state.original_mw / WATT) * WATT)

    def _restore(self, state: _Gpu, why: str) -> SetLimit:
        action = SetLimit(state.index, state.uuid, state.original_mw, state.original_mw, True,
                          why)
        state.pending = action
        return action

    def _set(self, state: _Gpu, limit_mw: int, why: str, now: float,
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

    def _may_lower(self, state: _Gpu, now: float) -> float | None:
        """None if the GPU may be lowered now, else when it may."""
        while state.lowered_at and now - state.lowered_at[0] >= MINUTE:
            state.lowered_at.popleft()
        if len(state.lowered_at) < self.cfg.max_changes_per_minute:
            return None
        return state.lowered_at[0] + MINUTE

    # --- one job -------------------------------------------------------------------

    def _members(self, job: str) -> list[_Gpu]:
        return sorted((s for s in self.gpus.values() if s.job == job and s.power is not None
                       and not s.unmanaged and not s.releasing), key=lambda s: s.index)

    def _job(self, name: str, allowance: EnergyAllowance | None,
             now: float) -> list[Action]:
        members = self._members(name)
        if allowance is None or allowance.max_slowdown <= 0 or not members:
            self.jobs.pop(name, None)
            return []
        job = self.jobs.get(name)
        gpus = tuple(s.uuid for s in members)
        if job is None or job.gpus != gpus:
            # A new job here, or its GPUs changed: measure again at their own limits.
            job = self.jobs[name] = _Job(allowance, gpus, since=now, baseline_at=now)
            self._window(job, members, now)
            lowered = [s for s in members if s.limit_mw is not None and s.pending is None]
            if lowered:
                job.phase = Phase.SETTLE  # the baseline is measured once they are back
            return [self._restore(s, "the job's GPUs changed: measuring again")
                    for s in lowered]
        job.allowance = allowance
        if any(s.pending is not None for s in members):
            return []  # a change is in flight: nothing is judged until it lands
        if job.phase is Phase.SETTLE:
            if now < job.since + self.cfg.settle:
                return []
            ignoring = [s for s in members if s.limit_mw is not None and s.observed_mw
                        is not None and s.observed_mw > s.limit_mw + WATT]
            for s in ignoring:
                s.unmanaged = s.why = (f"ignores power limit changes (asked "
                                       f"{s.limit_mw / WATT:g} W, it reports "
                                       f"{(s.observed_mw or 0) / WATT:g} W)")
            if ignoring:
                return []  # the job's GPUs changed: the next step starts it again
            job.phase = Phase.MEASURE
            self._window(job, members, now)
            return []
        self._look(job, members)
        if now < job.window_start + self.cfg.window:
            return []
        rate, problem = self._rate(job, members, now)
        if problem:
            job.why = problem
            self._window(job, members, now)
            return []
        return self._decide(job, members, rate, now)

    def _window(self, job: _Job, members: Sequence[_Gpu], now: float) -> None:
        job.window_start = now
        job.proxy_sum, job.proxy_n = 0.0, 0
        job.start = {}
        for s in members:
            s.draw_sum, s.draw_n, s.ahead_n, s.looks_n = 0.0, 0, 0, 0
        job.start = {s.uuid: (p.collectives, p.key) for s in members
                     if (p := self._progress.get(s.uuid)) is not None}

    def _look(self, job: _Job, members: Sequence[_Gpu]) -> None:
        proxy = 0.0
        complete = True
        for s in members:
            clock, util = self._clocks.get(s.uuid, (None, None))
            if clock is None or util is None:
                complete = False
            else:
                proxy += clock * util / 100
            if s.draw_w is not None:
                s.draw_sum += s.draw_w
                s.draw_n += 1
            progress = self._progress.get(s.uuid)
            if progress is not None and progress.ahead is not None:
                s.looks_n += 1
                s.ahead_n += progress.ahead
        if complete:
            job.proxy_sum += proxy
            job.proxy_n += 1

    def _rate(self, job: _Job, members: Sequence[_Gpu], now: float) -> tuple[float, str]:
        span = now - job.window_start
        counted = [(s.uuid, self._progress.get(s.uuid)) for s in members]
        if span > 0 and all(p is not None and s in job.start and job.start[s][1] == p.key
                            for s, p in counted):
            source = "collectives"
            rate = sum(p.collectives - job.start[s][0] for s, p in counted
                       if p is not None) / span
        elif any(p is not None and s in job.start and job.start[s][1] != p.key
                 for s, p in counted):
            return 0.0, "the job's processes changed during the window: measuring again"
        elif job.proxy_n:
            source = "clocks"
            rate = job.proxy_sum / job.proxy_n
        else:
            return 0.0, "no progress signal (no collectives, no clock readings)"
        if job.baseline is not None and source != job.source:
            job.baseline = None  # another signal: its baseline is measured anew
        if rate <= 0:
            return 0.0, "no progress in the window (the job is idle): not judged"
        job.source = source
        return rate, ""

    def _decide(self, job: _Job, members: list[_Gpu], rate: float,
                now: float) -> list[Action]:
        cfg = self.cfg
        tol = job.allowance.max_slowdown
        for s in members:
            s.waiting = bool(s.looks_n) and s.ahead_n / s.looks_n >= cfg.waiting_share
        if all(s.waiting for s in members):
            for s in members:
                s.waiting = False  # somebody is the slowest: ranks all ahead is noise
        draws = [s.draw_sum / s.draw_n for s in members if s.draw_n]
        job.efficiency = sum(draws) / rate if len(draws) == len(members) else None
        before, job.before = job.before, None
        if job.baseline is None:
            lowered = [s for s in members if s.limit_mw is not None]
            if lowered:
                job.phase, job.since = Phase.SETTLE, now
                return [self._restore(s, "measuring the baseline") for s in lowered]
            job.baseline, job.baseline_at, job.ratio, job.slowdown = rate, now, 1.0, 0.0
            for s in members:
                s.baseline_w = s.draw_sum / s.draw_n if s.draw_n else s.draw_w
            measured = f"baseline {rate:.4g}/s ({job.source})"
        else:
            job.ratio = rate / job.baseline
            job.slowdown = 1.0 - job.ratio
            measured = f"slowdown {job.slowdown:+.1%} of {tol:.1%} allowed ({job.source})"
            if job.slowdown >= cfg.backoff_at * tol:
                job.held = {}
                return self._back_off(job, members, measured, now)
            if before is not None and job.efficiency is not None and \
                    job.efficiency >= before * (1 + min(cfg.probe_below * tol, WORSE)):
                # More energy per unit of work than before the step (beyond measuring
                # noise): the step costs progress and saves no draw.
                return self._back_off(job, members, f"{measured}; the step saved no energy "
                                      f"per unit of work ({before:.4g} -> "
                                      f"{job.efficiency:.4g} W s)", now)
        if job.retrying:
            job.retrying, job.hold_scale = False, 1.0  # the step held: probing pays again
        if job.held:
            return self._resume(job, members, measured, now)
        if cfg.rebaseline and now - job.baseline_at >= cfg.rebaseline:
            job.held = {s.uuid: s.limit_mw for s in members if s.limit_mw is not None}
            job.baseline = None
            job.phase, job.since = Phase.SETTLE, now
            job.why = f"{measured}: measuring the baseline again"
            return [self._restore(s, "measuring the baseline again") for s in members
                    if s.limit_mw is not None]
        if (job.slowdown or 0.0) < cfg.probe_below * tol:
            if job.phase is Phase.HOLD and now - job.since >= cfg.hold * job.hold_scale:
                job.settled = {}  # held long enough: try lower again
                job.retrying = True
            return self._lower(job, members, measured, now)
        return self._hold(job, members, f"{measured}: holding", now)

    def _groups(self, members: list[_Gpu]) -> list[tuple[str, list[_Gpu]]]:
        """Ranks that wait on the others first: their slack costs the job nothing."""
        waiting = [s for s in members if s.waiting]
        critical = [s for s in members if not s.waiting]
        return [(name, gpus) for name, gpus in (("waiting", waiting), ("critical", critical))
                if gpus]

    def _blocked(self, gpus: Iterable[_Gpu], now: float) -> float | None:
        times = [t for s in gpus if (t := self._may_lower(s, now)) is not None]
        return max(times) if times else None

    def _lower(self, job: _Job, members: list[_Gpu], measured: str,
               now: float) -> list[Action]:
        for name, gpus in self._groups(members):
            if job.settled.get(name):
                continue
            room = [s for s in gpus if s.current_mw > s.lo_mw]
            if not room:
                job.settled[name] = True
                continue
            blocked = self._blocked(room, now)
            if blocked is not None:
                return self._hold(job, members, f"{measured}; rate limit: lower again from "
                                  f"{blocked:.0f}", now)
            job.last, job.last_group = tuple(s.uuid for s in room), name
            job.before = job.efficiency
            label = "the ranks that wait on others" if name == "waiting" else "the job's GPUs"
            return self._change(job, members, {s.uuid: max(s.lo_mw, s.current_mw - self._step(s))
                                               for s in room},
                                f"{measured}: one step lower for {label}", now, lowering=True)
        return self._hold(job, members, f"{measured}: nothing left to lower within the bounds",
                          now)

    def _resume(self, job: _Job, members: list[_Gpu], measured: str,
                now: float) -> list[Action]:
        """Back to the limits held before a new baseline, in one change."""
        targets = {s.uuid: job.held[s.uuid] for s in members if s.uuid in job.held}
        blocked = self._blocked((s for s in members if s.uuid in targets), now)
        if blocked is not None:
            return self._hold(job, members, f"{measured}; rate limit: back to the held limits "
                              f"from {blocked:.0f}", now)
        job.held = {}
        job.last, job.last_group = (), ""
        return self._change(job, members, targets, f"{measured}: back to the limits held "
                            "before it", now, lowering=True)

    def _back_off(self, job: _Job, members: list[_Gpu], measured: str,
                  now: float) -> list[Action]:
        lowered = [s for s in members if s.limit_mw is not None]
        if not lowered:
            return self._hold(job, members, f"{measured}: nothing to raise, the GPUs are at "
                              "their own limits", now)
        if job.retrying:
            # Lower failed again after a hold: wait twice as long before the next try.
            job.retrying, job.hold_scale = False, min(job.hold_scale * 2, MAX_HOLD_SCALE)
        last = [s for s in lowered if s.uuid in job.last]
        if last:
            job.settled[job.last_group] = True  # as low as that group goes for now
        else:
            last = lowered  # slower than allowed without a change of ours: all up a step
            job.settled = {"waiting": True, "critical": True}
        job.last, job.last_group = (), ""
        why = measured if "saved no energy" in measured else f"{measured}: near the tolerance"
        return self._change(job, members, {s.uuid: s.current_mw + self._step(s) for s in last},
                            f"{why}, one step back up", now, lowering=False)

    def _hold(self, job: _Job, members: list[_Gpu], why: str, now: float) -> list[Action]:
        if job.phase is not Phase.HOLD:
            job.phase, job.since = Phase.HOLD, now
        job.why = why
        self._window(job, members, now)
        return []

    def _change(self, job: _Job, members: list[_Gpu], targets: Mapping[str, int], why: str,
                now: float, *, lowering: bool) -> list[Action]:
        actions: list[Action] = []
        for s in members:
            target = targets.get(s.uuid)
            if target is not None and target != s.current_mw:
                actions.append(self._set(s, target, why, now,
                                         lowering=lowering and target < s.current_mw))
        if not actions:
            return self._hold(job, members, why, now)
        job.why = why
        job.phase, job.since = Phase.SETTLE, now
        return actions
