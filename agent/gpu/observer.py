"""GPU observer: NVML counters, telemetry, XIDs and which job each GPU serves.

No NVML, no driver or no GPUs is "feature absent", not an error. The
observation carries each GPU's latest snapshot, the events that arrived since
the last sample, and the provider's job label of every process on each GPU.
"""

from __future__ import annotations

import itertools
import logging
from pathlib import Path
from typing import Any

from agent.gpu.jobs import JobResolver
from agent.gpu.nvml import Nvml, NvmlUnavailable, preload
from agent.gpu.settings import GpuObserverSection
from agent.gpu.types import GpuSample, JobRef, gpu_class_of
from agent.kernel.kmsg import KmsgSource
from agent.observers.base import FeatureAbsent, Observer

log = logging.getLogger("harmonaize.agent")
#: /proc/PID/stat's flag of a task that is exiting (the kernel's PF_EXITING).
PF_EXITING = 0x4
#: Processes whose /proc/PID/stat is read per observation, at most.
MAX_STAT_READS = 256

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
        self.kmsg: KmsgSource | None = None
        self.kmsg_error = ""
        self._last: GpuSample | None = None
        self._last_versions: tuple[int, ...] = ()
        #: GPU processes whose job was known at the last sample.
        self._owned: frozenset[int] = frozenset()

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
        self._open_kmsg()
        names = {r.identity.name for r in nvml.readers}
        self.gpu_class = gpu_class_of(sorted(names)[0]) if names else "none"

    def _open_kmsg(self) -> None:
        """The kernel's log, for the driver's lines that name an XID's process. Without
        it (no permission, no such file) XIDs are attributed without the kernel's word."""
        if not self.cfg.kmsg_path:
            return
        source = KmsgSource(self.cfg.kmsg_path, from_start=self.cfg.kmsg_from_start)
        try:
            source.open()
        except OSError as exc:
            self.kmsg_error = f"{self.cfg.kmsg_path}: {exc.strerror or exc}"
            log.warning("kernel log not read (%s): XIDs are attributed without the "
                        "driver's lines", self.kmsg_error)
            return
        self.kmsg = source

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
            "kernel_log": vars(self.kmsg.counts) if self.kmsg else {"error": self.kmsg_error},
        }

    def judge_jobs_again(self) -> None:
        """A job's group on this host became known or changed (a declaration): the next
        sample resolves every process's job again, even if no reading moved since."""
        self._last = None

    def sample(self, now: float) -> GpuSample:
        assert self.nvml is not None
        lines = tuple(self.kmsg.read()) if self.kmsg is not None else ()
        if self._last is not None and not lines and self.nvml.quiet_since(self._last_versions):
            return self._last  # the same observation, number and all: nothing new
        self._last_versions = self.nvml.versions()
        snapshots = self.nvml.snapshots()
        jobs: dict[int, tuple[JobRef, ...]] = {}
        owners: dict[int, JobRef] = {}
        live: set[int] = set()
        for snap in snapshots:
            processes = snap.telemetry.processes if snap.telemetry else ()
            for p in processes:
                if (ref := self.resolver.resolve(p.pid)) is not None:
                    owners[p.pid] = ref
            refs = {owners[p.pid] for p in processes if p.pid in owners}
            live.update(p.pid for p in processes)
            if refs:
                jobs[snap.identity.index] = tuple(sorted(refs, key=lambda r: (r.job,
                                                                              r.rank or "")))
        self.resolver.forget_except(live)
        events = tuple(self.nvml.drain_events())
        # Whether an XID's process was ending: read when there is an XID to judge, and
        # for a process whose job was known and no longer resolves while NVML lists it
        # (killed before its GPU let go: the attribution keeps its job only if it is
        # ending). Rare, so the sampling pass does not read /proc for every process.
        unresolved = {pid for pid in live if pid not in owners and pid in self._owned}
        self._owned = frozenset(owners) | unresolved  # looked at again while listed
        exiting = self._exiting(live | {x.pid for x in lines if x.pid}) \
            if events or lines else self._exiting(unresolved) if unresolved else frozenset()
        self._last = GpuSample(tuple(snapshots), events, jobs, self.cfg.call_timeout,
                               next(SAMPLES), owners, exiting, lines)
        return self._last

    def _exiting(self, pids: set[int]) -> frozenset[int]:
        """Processes that /proc shows exiting (PF_EXITING), a zombie, dead, or gone."""
        return frozenset(pid for pid in sorted(pids)[:MAX_STAT_READS]
                         if process_ending(Path(self.cfg.procfs_root), pid))

    def stop(self) -> None:
        if self.kmsg is not None:
            self.kmsg.close()
            self.kmsg = None
        if self.nvml is not None:
            self.nvml.stop()
            self.nvml = None


def process_ending(proc_root: Path, pid: int) -> bool:
    """/proc/PID/stat: state Z or X, or the PF_EXITING flag; a process gone is ending.
    The command name (field 2) is the process's own and may hold spaces and ")": the
    fields after the last ")" are the kernel's."""
    try:
        with (proc_root / str(pid) / "stat").open("rb") as f:
            text = f.read(4096).decode("ascii", "replace")
    except FileNotFoundError:
        return True
    except OSError:
        return False
    fields = text.rpartition(")")[2].split()
    try:
        return fields[0] in ("Z", "X", "x") or bool(int(fields[6]) & PF_EXITING)
    except (IndexError, ValueError):
        return False


__all__ = ["GpuObserver", "process_ending"]
