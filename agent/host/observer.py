"""Host observer (I/O): CPU, memory and load.

Reads /proc/stat and /proc/meminfo from files kept open (procfs regenerates
them on every read at offset 0): a tenth of what parsing them afresh through
psutil costs, which matters for a daemon that must stay under 1% of a core.
psutil supplies the boot time.
"""

from __future__ import annotations

import os

import psutil

from agent.host.types import HostSample
from agent.kernel.sysfs import ProcFile
from agent.observers.base import Observer


def parse_meminfo(text: str) -> tuple[int, int]:
    """(MemTotal, MemAvailable) in bytes from /proc/meminfo."""
    total = available = 0
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            total = int(line.split()[1]) * 1024
        elif line.startswith("MemAvailable:"):
            available = int(line.split()[1]) * 1024
            break
    return total, available


def parse_cpu_times(text: str) -> tuple[int, int]:
    """(busy, total) jiffies from the aggregate ``cpu`` line of /proc/stat."""
    fields = text.split("\n", 1)[0].split()
    if not fields or fields[0] != "cpu":
        return 0, 0
    values = [int(v) for v in fields[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


class HostObserver(Observer):
    name = "host"

    def __init__(self, interval: float, procfs_root: str = "/proc") -> None:
        self.interval = interval
        self._boot_time = 0.0
        self._stat = ProcFile(procfs_root, "stat")
        self._meminfo = ProcFile(procfs_root, "meminfo")
        self._cpu = (0, 0)

    def start(self) -> None:
        self._boot_time = psutil.boot_time()
        self._cpu = parse_cpu_times(self._stat.read())

    def sample(self, now: float) -> HostSample:
        busy, total = parse_cpu_times(self._stat.read())
        delta_total = total - self._cpu[1]
        utilization = (busy - self._cpu[0]) / delta_total if delta_total > 0 else 0.0
        self._cpu = (busy, total)
        memory_total, available = parse_meminfo(self._meminfo.read())
        return HostSample(
            cpu_utilization=min(1.0, max(0.0, utilization)),
            memory_total_bytes=memory_total,
            memory_available_bytes=available,
            load1=os.getloadavg()[0],
            uptime_seconds=max(0.0, now - self._boot_time),
        )

    def stop(self) -> None:
        self._stat.close()
        self._meminfo.close()

