"""Operator-facing rows for ``harmonctl gpus`` and ``harmonctl health``."""

from __future__ import annotations

from typing import Any

from agent.gpu.health import GpuView, holding
from harmonaize.schema import to_plain


def gpu_row(view: GpuView) -> dict[str, Any]:
    snap = view.snapshot
    telemetry = snap.telemetry if snap else None
    counters = snap.counters.values if snap and snap.counters else {}
    identity = snap.identity if snap else None
    return {
        "index": view.index,
        "uuid": view.uuid,
        "name": view.name,
        "pci_bus_id": identity.pci_bus_id if identity else "",
        "state": view.state.value,
        "action": view.action.value,
        "temperature_c": telemetry.temperature_c if telemetry else None,
        "power_w": telemetry.power_w if telemetry else None,
        "power_limit_w": telemetry.power_limit_w if telemetry else None,
        "sm_clock_mhz": telemetry.sm_clock_mhz if telemetry else None,
        "util_gpu": telemetry.util_gpu if telemetry else None,
        "mem_used": telemetry.mem_used if telemetry else None,
        "mem_total": telemetry.mem_total if telemetry else None,
        "pcie_gen": telemetry.pcie_gen if telemetry else None,
        "pcie_max_gen": identity.pcie_max_gen if identity else None,
        "pcie_width": telemetry.pcie_width if telemetry else None,
        "pcie_max_width": identity.pcie_max_width if identity else None,
        "nvlinks": identity.nvlinks if identity else 0,
        "nvlinks_up": telemetry.nvlinks_up if telemetry else None,
        "clocks_event_reasons": snap.counters.clocks_event_reasons if snap and snap.counters
        else None,
        "counters": dict(counters),
        "processes": [to_plain(p) for p in telemetry.processes] if telemetry else [],
        "jobs": [to_plain(j) for j in view.jobs],
        "xids": view.xid_count,
        "recent_xids": recent_xids(view),
        "hung_call": snap.hung_call if snap else None,
        "error": snap.error if snap else "",
    }


def health_row(view: GpuView) -> dict[str, Any]:
    return {
        "index": view.index,
        "state": view.state.value,
        "why": view.why,
        "since": view.since,
        "action": view.action.value,
        "xids": view.xid_count,
        "recent_xids": recent_xids(view),
        "jobs": [to_plain(j) for j in view.jobs],
        "conditions": [
            {**to_plain(c), "action": view.actions.get(c.type, "none")}
            for c in holding(view)
        ],
    }


def recent_xids(view: GpuView) -> list[dict[str, Any]]:
    """The GPU's latest XIDs, newest last: when, which, whose fault they were judged
    (hardware or application), why, and the job for an application's."""
    return [to_plain(x) for x in view.recent_xids]
