"""The GPU observer's settings (``[observers.gpu]``), and where job identity comes from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, ClassVar

from harmonaize.config import AbsPath
from harmonaize.schema import Len, Num, Str

#: A Slurm job's cgroup where slurmd makes it, v1 (``/slurm[_<node>]/uid_<u>/job_<id>/...``)
#: or v2 (``/system.slice/[<node>_]slurmstepd.scope/job_<id>/...``). Anchored at the root:
#: a tenant may own a delegated subtree (systemd's ``user@<uid>.service``) and name a
#: cgroup ``job_<id>`` there, but cannot make one under root's ``slurm`` or ``system.slice``.
SLURM_JOB_CGROUP = (r"^(?:/slurm(?:_[^/]+)?/uid_[0-9]+"
                    r"|/system\.slice/(?:[^/]+_)?slurmstepd\.scope)/job_(?P<job>[0-9]+)(?:/|$)")

EnvName = Annotated[str, Str(max_len=64, min_len=1, pattern=r"[A-Za-z_][A-Za-z0-9_]*")]


@dataclass(frozen=True)
class GpuObserverSection:
    STRICT_KEYS: ClassVar[bool] = True
    LIVE: ClassVar[frozenset[str]] = frozenset({
        "sbe_per_minute", "pcie_replays_per_minute", "nvlink_crc_per_second",
        "nvlink_replays_per_minute", "retired_pages_limit", "slowdown_sustain",
        "busy_utilization", "xid_hold", "suspect_clear", "advisory_interval", "kmsg_wait",
        "xid_match_window", "teardown_window", "xid_recur_window"})
    enabled: bool = True
    #: A specific libnvidia-ml.so.1 (tests and the demo use a fake); empty: the driver's.
    nvml_library: Annotated[str, Str(max_len=4096, pattern=r"/.*")] = ""
    #: Seconds after which a GPU stuck in an NVML call counts as unresponsive.
    call_timeout: Annotated[float, Num(0.05, 600.0)] = 2.0
    #: Seconds between reads of the error counters (ECC, remapping, PCIe, NVLink). An
    #: XID, ECC or page retirement event triggers a read at once, whatever this says.
    counter_interval: Annotated[float, Num(0.01, 3600.0)] = 1.0
    #: Seconds between reads of temperature, power, clocks, PCIe link and processes.
    slow_interval: Annotated[float, Num(0.05, 3600.0)] = 1.0
    #: Seconds the event thread waits in nvmlEventSetWait_v2 per call (events end the
    #: wait at once; this only bounds how long stopping takes).
    event_wait: Annotated[float, Num(0.01, 60.0)] = 1.0
    procfs_root: AbsPath = "/proc"
    #: Environment variable the provider's scheduler sets to a process's job id: a hint
    #: only, which the process's cgroup or its holding the job's Unix group must back.
    job_env: EnvName = "HARMONAIZE_JOB"
    #: A regular expression with a group named "job" over the process's cgroup path:
    #: where it matches, the cgroup names the job. The default is Slurm's (proctrack or
    #: task/cgroup): "job_<id>" as a whole path component, in cgroup v1's
    #: /slurm[_<node>]/uid_<u>/job_<id>/step_<n> and v2's .../job_<id>/step_<n>/...;
    #: "" turns it off.
    job_cgroup_pattern: Annotated[str, Str(max_len=512)] = SLURM_JOB_CGROUP
    #: Launcher variables that name a process's rank, in the tenant's terms.
    rank_env: Annotated[tuple[EnvName, ...], Len(16)] = (
        "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
    #: Volatile single-bit ECC errors within a minute that make a GPU suspect.
    sbe_per_minute: Annotated[float, Num(1.0, 1e9)] = 60.0
    #: PCIe replays within a minute that make a GPU suspect, at PCIe gen 3; the
    #: allowance doubles with each generation above (faster links replay more).
    pcie_replays_per_minute: Annotated[float, Num(1.0, 1e9)] = 8.0
    #: NVLink CRC errors (flit and data) per second, over 10 s, that make a GPU suspect.
    nvlink_crc_per_second: Annotated[float, Num(1.0, 1e9)] = 100.0
    #: NVLink replays within a minute that make a GPU suspect (any recovery does).
    nvlink_replays_per_minute: Annotated[float, Num(1.0, 1e9)] = 60.0
    #: Retired pages at which a GPU is quarantined for RMA.
    retired_pages_limit: Annotated[int, Num(1, 1_000_000)] = 60
    #: Seconds of thermal or power slowdown before a GPU is suspect.
    slowdown_sustain: Annotated[float, Num(0.0, 3600.0)] = 10.0
    #: The PCIe generation counts as degraded only above this utilization (%):
    #: idle GPUs lower their link generation to save power.
    busy_utilization: Annotated[int, Num(0, 100)] = 10
    #: Seconds an XID keeps its condition after it was last seen.
    xid_hold: Annotated[float, Num(0.0, 86400.0)] = 300.0
    #: Seconds without suspect signals before a suspect GPU is healthy again.
    suspect_clear: Annotated[float, Num(0.0, 86400.0)] = 600.0
    #: At most one checkpoint advisory per job in this many seconds, unless it gets worse.
    advisory_interval: Annotated[float, Num(0.0, 86400.0)] = 60.0
    #: The kernel's log, read for the driver's XID lines (which name the process): the
    #: kernel's /dev/kmsg, or a file or FIFO written in its format (tests, the demo);
    #: "" reads none (XIDs are then attributed without the kernel's word).
    kmsg_path: Annotated[str, Str(max_len=4096, pattern=r"(/.*)?")] = "/dev/kmsg"
    #: Read the kernel's log from its oldest record instead of from the agent's start.
    kmsg_from_start: bool = False
    #: Seconds an application-likely XID waits for the driver's line naming its process.
    kmsg_wait: Annotated[float, Num(0.0, 60.0)] = 2.0
    #: Seconds between an XID event and the driver's line for them to be the same XID.
    xid_match_window: Annotated[float, Num(0.1, 600.0)] = 10.0
    #: Seconds before an XID in which a job's process leaving the GPU makes a teardown.
    teardown_window: Annotated[float, Num(0.0, 600.0)] = 5.0
    #: Seconds in which the same XID on a GPU under a different job is the hardware's.
    xid_recur_window: Annotated[float, Num(0.0, 30 * 86400.0)] = 3600.0

    def __post_init__(self) -> None:
        if self.job_cgroup_pattern:
            try:
                pattern = re.compile(self.job_cgroup_pattern)
            except re.error as exc:
                raise ValueError(f"job_cgroup_pattern is not a regular expression: {exc}") \
                    from None
            if "job" not in pattern.groupindex:
                raise ValueError("job_cgroup_pattern needs a group named job: (?P<job>...)")
