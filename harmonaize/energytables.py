"""``harmonctl energy``: the energy loop's jobs and GPUs as tables."""

from __future__ import annotations

from typing import Any

from harmonaize.tables import table


def _watts(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}W"


def _share(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.1%}" if signed else f"{value:.1%}"


def render_energy(result: dict[str, Any]) -> str:
    if not result.get("enabled"):
        return "energy: the loop is off (energy.enabled = false)"
    jobs = [{**j, "slack": _share(j["max_slowdown"]), "slowdown": _share(j["slowdown"], True),
             "saved": _share(j["saved_share"]), "floor": _watts(j["min_watts"] or None)}
            for j in result.get("jobs", [])]
    gpus = [{**g, "limit": _watts(g["limit_w"]), "set": _watts(g["set_w"]),
             "original": _watts(g["original_w"]), "floor": _watts(g["floor_w"]),
             "draw": _watts(g["draw_w"])} for g in result.get("gpus", [])]
    parts = []
    if jobs:
        parts.append(table(jobs, [
            ("job", "JOB"), ("slack", "SLACK"), ("floor", "FLOOR"), ("phase", "PHASE"),
            ("progress", "PROGRESS"), ("slowdown", "SLOWDOWN"), ("used_kj", "USED kJ"),
            ("saved_kj", "SAVED kJ"), ("saved", "SAVED"), ("why", "WHY")]))
    if gpus:
        parts.append(table(gpus, [
            ("index", "GPU"), ("job", "JOB"), ("state", "STATE"), ("limit", "LIMIT"),
            ("set", "SET"), ("original", "ORIGINAL"), ("floor", "FLOOR"), ("draw", "DRAW"),
            ("saved_kj", "SAVED kJ"), ("waits_on_others", "WAITS"), ("why", "WHY")]))
    if not parts:
        parts.append("energy: no job on this host declares a slowdown for energy")
    left = result.get("left_lowered") or []
    if left:
        parts.append("\n".join(f"LEFT LOWERED: gpu {x['index']} should be at "
                               f"{x['original_w']:.0f}W: {x['error']}" for x in left))
    changes = result.get("changes") or {}
    if changes:
        parts.append("changes: " + ", ".join(f"{k} {v}" for k, v in sorted(changes.items())))
    return "\n\n".join(parts)
