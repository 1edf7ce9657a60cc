"""Host observer: CPU, memory and load through psutil."""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from agent.config import AgentConfig
from agent.observers.base import Observer, register


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


class HostObserver(Observer):
    name = "host"

    def __init__(self) -> None:
        self._boot_time = 0.0

    def start(self) -> None:
        self._boot_time = psutil.boot_time()
        psutil.cpu_percent(interval=None)  # primes the delta for the first sample

    def sample(self, now: float) -> HostSample:
        memory = psutil.virtual_memory()
        return HostSample(
            cpu_utilization=psutil.cpu_percent(interval=None) / 100.0,
            memory_total_bytes=memory.total,
            memory_available_bytes=memory.available,
            load1=psutil.getloadavg()[0],
            uptime_seconds=max(0.0, now - self._boot_time),
        )


def _factory(cfg: AgentConfig) -> Observer:
    return HostObserver()


register("host", _factory, enabled=lambda cfg: cfg.observers.host.enabled)
