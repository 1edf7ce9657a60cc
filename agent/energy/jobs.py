"""The energy loop's decisions for one job: baseline, step down, back off, hold.

Part of :class:`agent.energy.engine.EnergyLoop` (which it is mixed into): the loop
owns the GPUs' limits and the rate limits, this part decides per job what the limits
of its GPUs should be next. Sans-I/O: time is a parameter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from agent.energy.settings import EnergySection
from agent.energy.types import (
    MAX_HOLD_SCALE,
    WATT,
    WORSE,
    Action,
    GpuPower,
    JobPower,
    Phase,
    RankProgress,
    SetLimit,
)
from harmonaize.messages import EnergyAllowance


class JobDecisions:
    """The per-job half of the energy loop (see :mod:`agent.energy.engine`)."""

    cfg: EnergySection
    gpus: dict[str, GpuPower]
    jobs: dict[str, JobPower]
    _progress: dict[str, RankProgress]
    _clocks: dict[str, tuple[int | None, int | None]]

    if TYPE_CHECKING:  # the loop's own half (agent/energy/engine.py)
        def _set(self, state: GpuPower, limit_mw: int, why: str, now: float,
                 lowering: bool) -> SetLimit: ...

        def _restore(self, state: GpuPower, why: str) -> SetLimit: ...

        def _step(self, state: GpuPower) -> int: ...

        def _may_lower(self, state: GpuPower, now: float) -> float | None: ...

    # --- one job -------------------------------------------------------------------

    def _members(self, job: str) -> list[GpuPower]:
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
            job = self.jobs[name] = JobPower(allowance, gpus, since=now, baseline_at=now)
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

    def _window(self, job: JobPower, members: Sequence[GpuPower], now: float) -> None:
        job.window_start = now
        job.proxy_sum, job.proxy_n = 0.0, 0
        job.start = {}
        for s in members:
            s.draw_sum, s.draw_n, s.ahead_n, s.looks_n = 0.0, 0, 0, 0
        job.start = {s.uuid: (p.collectives, p.key) for s in members
                     if (p := self._progress.get(s.uuid)) is not None}

    def _look(self, job: JobPower, members: Sequence[GpuPower]) -> None:
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

    def _rate(self, job: JobPower, members: Sequence[GpuPower], now: float) -> tuple[float, str]:
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

    def _decide(self, job: JobPower, members: list[GpuPower], rate: float,
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

    def _groups(self, members: list[GpuPower]) -> list[tuple[str, list[GpuPower]]]:
        """Ranks that wait on the others first: their slack costs the job nothing."""
        waiting = [s for s in members if s.waiting]
        critical = [s for s in members if not s.waiting]
        return [(name, gpus) for name, gpus in (("waiting", waiting), ("critical", critical))
                if gpus]

    def _blocked(self, gpus: Iterable[GpuPower], now: float) -> float | None:
        times = [t for s in gpus if (t := self._may_lower(s, now)) is not None]
        return max(times) if times else None

    def _lower(self, job: JobPower, members: list[GpuPower], measured: str,
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

    def _resume(self, job: JobPower, members: list[GpuPower], measured: str,
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

    def _back_off(self, job: JobPower, members: list[GpuPower], measured: str,
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

    def _hold(self, job: JobPower, members: list[GpuPower], why: str, now: float) -> list[Action]:
        if job.phase is not Phase.HOLD:
            job.phase, job.since = Phase.HOLD, now
        job.why = why
        self._window(job, members, now)
        return []

    def _change(self, job: JobPower, members: list[GpuPower], targets: Mapping[str, int], why: str,
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
