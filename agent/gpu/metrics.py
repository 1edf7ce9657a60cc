"""The GPU domain's metrics: GPUs by state, GPUs in use, advisories sent, XIDs by
whose fault they were judged (the energy loop's are agent/energy/metrics.py)."""

from __future__ import annotations

from collections.abc import Mapping

from agent.gpu.states import GpuState
from harmonaize.messages import HostSummary
from harmonaize.metrics import Family, counter, gauge


def families(prefix: str, summary: HostSummary | None, advisories_sent: int,
             xids: Mapping[str, int] | None = None) -> list[Family]:
    gpus = gauge(f"{prefix}_gpus", "GPUs by health state.")
    if summary is not None:
        for value in GpuState:
            gpus.add(getattr(summary.gpus, value.value, 0), state=value.value)
    return [
        gpus,
        gauge(f"{prefix}_gpus_in_use", "GPUs running a tenant's processes (any state).").add(
            summary.gpus.in_use if summary is not None else None),
        counter(f"{prefix}_advisories_total", "Checkpoint advisories sent to jobs.").add(
            advisories_sent),
        xid_family(prefix, xids or {}),
    ]


def xid_family(prefix: str, xids: Mapping[str, int]) -> Family:
    family = counter(f"{prefix}_xids_total", "XIDs by whose fault they were judged: the "
                     "hardware's (held on the GPU) or a job's own process's (told to its "
                     "owner, quarantining nothing).")
    for verdict in ("hardware", "application"):
        family.add(xids.get(verdict, 0), **{"class": verdict})
    return family
