"""The host domain's plain data: one sample of CPU, memory and load."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostSample:
    cpu_utilization: float
    """Share of all CPUs busy since the previous sample, 0..1."""
    memory_total_bytes: int
    memory_available_bytes: int
    load1: float
    uptime_seconds: float

    @property
    def memory_available_fraction(self) -> float:
        if not self.memory_total_bytes:
            return 1.0
        return self.memory_available_bytes / self.memory_total_bytes
