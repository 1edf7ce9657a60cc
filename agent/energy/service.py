"""The energy loop's I/O shell: observations in, NVML power calls out.

Each agent pass hands it the GPU observation and the declarations; it steps the
loop (agent/energy/engine.py) every ``interval`` and at the loop's own deadlines,
with the ranks' progress read from the tuner plugin's stats files, and submits
the loop's requests to :class:`agent.energy.power.PowerControl` (a worker thread,
every call bounded). At start it puts back what a killed agent left lowered; at
stop it puts back everything the loop changed, before NVML goes.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from agent.energy.engine import (
    WATT,
    EnergyGpu,
    EnergyLoop,
    EnergyObservation,
    PowerInfo,
    ReadPower,
    SetLimit,
    progress_of,
)
from agent.energy.power import Originals, PowerControl, Saved, restore_left
from agent.energy.settings import EnergySection
from agent.gpu.interface import GpuSample
from agent.plugin.shm import StatsReader
from harmonaize.messages import EnergyAllowance, JobDeclaration, JobEnergy

log = logging.getLogger("harmonaize.agent")

ENERGY_FILE = "energy.json"


class EnergyService:
    def __init__(self, cfg: EnergySection, state_dir: str | Path,
                 handles: Callable[[], Mapping[str, Any]], *, call_timeout: float,
                 policy_dir: str | Path | None = None,
                 wake: Callable[[], None] = lambda: None) -> None:
        self.cfg = cfg
        self.loop = EnergyLoop(cfg)
        self.policy_dir = policy_dir
        #: The ranks' stats files (a tenant's): bounded reads, in turn across looks.
        self.stats_reader = StatsReader(policy_dir) if policy_dir is not None else None
        self.originals = Originals(Path(state_dir) / ENERGY_FILE)
        self.control = PowerControl(self.originals, handles, call_timeout, on_done=wake)
        self.info: dict[str, PowerInfo] = {}
        #: Restores a previous run left and that failed here (retried at the next start).
        self.left: list[tuple[Saved, str]] = []
        self.changes: Counter[str] = Counter()
        self._next = 0.0
        self._reported: tuple[JobEnergy, ...] = ()
        self._report_at = float("-inf")

    def configure(self, cfg: EnergySection) -> None:
        """A reload: new settings for the running loop (what it holds stays)."""
        self.cfg = cfg
        self.loop.configure(cfg)

    def restore_left(self) -> None:
        """Put back what a killed agent left lowered (also with the loop switched off)."""
        self.left = restore_left(self.control)

    def start(self) -> None:
        self.control.start()

    def stop(self) -> None:
        """Every GPU the loop changed back at its own limit, now (the agent stops)."""
        self.control.stop()  # what was submitted lands first
        self._collect(0.0)
        for action in self.loop.stop():
            error = self.control.execute(action).error
            self._count(action, error)
            if error:
                log.error("energy: gpu %d: restoring %g W at stop failed: %s (it is restored "
                          "at the next start)", action.index, action.limit_mw / WATT, error)
        # Anything else still on file (a restore that failed during the run).
        for saved, error in restore_left(self.control):
            log.error("energy: gpu %d stays at a lowered limit: %s", saved.index, error)

    # --- each pass -----------------------------------------------------------------

    def step(self, sample: GpuSample | None, declarations: Mapping[str, JobDeclaration],
             now: float, out_of_service: Collection[int] = ()) -> None:
        """``out_of_service``: GPUs being validated, quarantined or lost: no job's to slow
        (a validation's benchmarks must run at the GPU's own limit)."""
        arrived = self._collect(now)
        deadline = self.loop.next_deadline()
        if not arrived and now < self._next and (deadline is None or now < deadline):
            return
        self._next = now + self.cfg.interval
        jobs = {job: d.energy for job, d in declarations.items() if d.energy is not None}
        observation = self._observe(sample, jobs, frozenset(out_of_service))
        for action in self.loop.step(observation, now):
            self.control.submit(action)

    def _collect(self, now: float) -> bool:
        outcomes = self.control.outcomes()
        for request, info, error, timed_out in outcomes:
            if isinstance(request, ReadPower):
                if info is not None:
                    self.info[request.uuid] = info
                else:
                    log.warning("energy: gpu %d: its power range cannot be read: %s",
                                request.index, error)
                    self.loop.unreadable(request.uuid, error)
                continue
            self._count(request, error)
            if error:
                log.warning("energy: gpu %d: setting %g W failed: %s", request.index,
                            request.limit_mw / WATT, error)
                self.loop.failed(request, error, now, uncertain=timed_out)
            else:
                log.info("energy: gpu %d: power limit %g W (%s)", request.index,
                         request.limit_mw / WATT, request.why)
                self.loop.applied(request, now)
        return bool(outcomes)

    def _count(self, action: SetLimit, error: str) -> None:
        if error:
            self.changes["failed"] += 1
        elif action.restore:
            self.changes["restore"] += 1
        else:
            self.changes["set"] += 1

    def _observe(self, sample: GpuSample | None, jobs: Mapping[str, EnergyAllowance],
                 out_of_service: frozenset[int]) -> EnergyObservation:
        if sample is None:
            return EnergyObservation((), jobs)
        job_of: dict[int, str] = {}
        for index, refs in sample.jobs.items():
            names = {r.job for r in refs}
            if len(names) == 1 and index not in out_of_service:
                # A GPU shared by several jobs is nobody's to slow.
                job_of[index] = names.pop()
        progress = {}
        if self.stats_reader is not None:
            self.stats_reader.keep(set(job_of.values()) & set(jobs))
            for job in sorted(set(job_of.values()) & set(jobs)):
                pids = {p.pid: snap.identity.index for snap in sample.gpus
                        if job_of.get(snap.identity.index) == job and snap.telemetry
                        for p in snap.telemetry.processes}
                slots = self.stats_reader.read(job, remove_dead=False)
                progress.update(progress_of(slots, pids))
        gpus = []
        for snap in sample.gpus:
            t = snap.telemetry
            index = snap.identity.index
            gpus.append(EnergyGpu(
                index, snap.identity.uuid, job_of.get(index),
                None if t is None or t.power_limit_w is None else round(t.power_limit_w * WATT),
                None if t is None or t.power_w is None else round(t.power_w * WATT),
                t.sm_clock_mhz if t else None, t.util_gpu if t else None,
                self.info.get(snap.identity.uuid), progress.get(index)))
        return EnergyObservation(tuple(gpus), jobs)

    def reported(self, now: float) -> tuple[JobEnergy, ...]:
        """Per job, the energy its GPUs here used and saved in kJ, for the host summary:
        new figures every ``report_interval`` (the summary goes out when it changes)."""
        if now >= self._report_at or self._report_at - now > self.cfg.report_interval:
            self._reported = tuple(
                JobEnergy(job, round(used / 1000), max(0, round(saved / 1000)))
                for job, (used, saved) in sorted(self.loop.report().items()))[:64]
            self._report_at = now + self.cfg.report_interval
        return self._reported

    # --- what operators see --------------------------------------------------------

    def view(self) -> dict[str, Any]:
        loop = self.loop
        gpus = []
        for state in sorted(loop.gpus.values(), key=lambda s: s.index):
            power = state.power
            gpus.append({
                "index": state.index, "uuid": state.uuid, "job": state.job,
                "limit_w": None if state.observed_mw is None else state.observed_mw / WATT,
                "set_w": None if state.limit_mw is None else state.limit_mw / WATT,
                "original_w": power.original_mw / WATT if power else None,
                "floor_w": state.lo_mw / WATT if power else None,
                "draw_w": state.draw_w,
                "saved_kj": round(state.saved_j / 1000, 3),
                "used_kj": round(state.used_j / 1000, 3),
                "waits_on_others": state.waiting,
                "state": ("unmanaged" if state.unmanaged else "releasing" if state.releasing
                          else "reading" if power is None else
                          "lowered" if state.limit_mw is not None else "own limit"),
                "why": state.why if state.unmanaged or state.releasing or power is None
                else loop.jobs[state.job].why if state.job in loop.jobs else state.why,
            })
        report = loop.report()
        jobs = []
        for name, job in sorted(loop.jobs.items()):
            used, saved = report.get(name, (0.0, 0.0))
            jobs.append({
                "job": name, "max_slowdown": job.allowance.max_slowdown,
                "min_watts": job.allowance.min_watts, "phase": job.phase.value,
                "progress": job.source or None, "baseline_per_s": job.baseline,
                "slowdown": job.slowdown, "used_kj": round(used / 1000, 3),
                "saved_kj": round(saved / 1000, 3),
                "saved_share": saved / (used + saved) if used + saved > 0 else None,
                "why": job.why,
            })
        return {
            "enabled": True,
            "gpus": gpus,
            "jobs": jobs,
            "changes": dict(self.changes),
            "left_lowered": [{"index": s.index, "uuid": s.uuid, "original_w":
                              s.original_mw / WATT, "error": e} for s, e in self.left],
            "originals_file": str(self.originals.path),
            "originals_error": self.originals.error,
        }
