"""GPU observer: NVML counters, telemetry, XIDs and which job each GPU serves.

No NVML, no driver or no GPUs is "feature absent", not an error. The
observation carries each GPU's latest snapshot, the events that arrived since
the last sample, and the provider's job label of every process on each GPU.
"""

from __future__ import annotations

import itertools
from typing import Any

from agent.gpu.jobs import JobResolver
from agent.gpu.nvml import Nvml, NvmlUnavailable, preload
from agent.gpu.settings import GpuObserverSection
from agent.gpu.types import GpuSample, JobRef, gpu_class_of
from agent.observers.base import FeatureAbsent, Observer

#: Observation numbers, unique in the process, so an observer started by a reload
#: never repeats one the engine already stepped on.
SAMPLES = itertools.count(1)


class GpuObserver(Observer):
    name = "gpu"

    def __init__(self, cfg: GpuObserverSection) -> None:
        self.cfg = cfg
        self.nvml: Nvml | None = None
        self.resolver = JobResolver(cfg.procfs_root, cfg.job_env, cfg.job_cgroup_pattern,
                                    cfg.rank_env)
        self.gpu_class = "none"
        self._last: GpuSample | None = None
        self._last_versions: tuple[int, ...] = ()

    def start(self) -> None:
        try:
            if self.cfg.nvml_library:
                preload(self.cfg.nvml_library)
            nvml = Nvml(interval=self.cfg.counter_interval, slow_interval=self.cfg.slow_interval,
                        call_timeout=self.cfg.call_timeout,
                        event_wait_ms=int(self.cfg.event_wait * 1000),
                        on_change=self._changed)
            nvml.start()
        except NvmlUnavailable as exc:
            raise FeatureAbsent(str(exc)) from None
        self.nvml = nvml
        names = {r.identity.name for r in nvml.readers}
        self.gpu_class = gpu_class_of(sorted(names)[0]) if names else "none"

    def _changed(self) -> None:
        self.wake()  # something happened: let the agent look now, not next interval

    def describe(self) -> dict[str, Any]:
        if self.nvml is None:
            return {}
        watcher = self.nvml.watcher
        return {
            "detail": f"{len(self.nvml.readers)} GPU(s), {self.gpu_class}, driver "
                      f"{self.nvml.driver_version or 'unknown'}"
                      + (f"; {watcher.error}" if watcher and watcher.error else ""),
            "gpu_class": self.gpu_class,
            "events_registered": dict(watcher.registered) if watcher else {},
            # Processes whose HARMONAIZE_JOB their cgroup or groups do not back.
            "job_claims_refused": self.resolver.refused,
        }

    def judge_jobs_again(self) -> None:
        """A job's group on this host became known or changed (a declaration): the next
        sample resolves every process's job again, even if no reading moved since."""
        self._last = None

    def sample(self, now: float) -> GpuSample:
        assert self.nvml is not None
        if self._last is not None and self.nvml.quiet_since(self._last_versions):
            return self._last  # the same observation, number and all: nothing new
        self._last_versions = self.nvml.versions()
        snapshots = self.nvml.snapshots()
        jobs: dict[int, tuple[JobRef, ...]] = {}
        live: set[int] = set()
        for snap in snapshots:
            processes = snap.telemetry.processes if snap.telemetry else ()
            refs = {ref for p in processes if (ref := self.resolver.resolve(p.pid))}
            live.update(p.pid for p in processes)
            if refs:
                jobs[snap.identity.index] = tuple(sorted(refs, key=lambda r: (r.job,
                                                                              r.rank or "")))
        self.resolver.forget_except(live)
        self._last = GpuSample(tuple(snapshots), tuple(self.nvml.drain_events()), jobs,
                               self.cfg.call_timeout, next(SAMPLES))
        return self._last

    def stop(self) -> None:
        if self.nvml is not None:
            self.nvml.stop()
            self.nvml = None


__all__ = ["GpuObserver"]
