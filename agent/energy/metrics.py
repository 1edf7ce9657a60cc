"""The energy domain's metrics: the energy loop's power limits and what they saved
(summed: no GPU index or job is a label)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from harmonaize.metrics import Family, counter, gauge

if TYPE_CHECKING:
    from agent.energy.service import EnergyService

ENERGY_STATES = ("lowered", "own limit", "unmanaged", "releasing", "reading")


def families(prefix: str, energy: EnergyService | None) -> list[Family]:
    gpus = gauge(f"{prefix}_energy_gpus", "GPUs of jobs that declared a slowdown for energy, "
                 "by what the energy loop holds (lowered, own limit, unmanaged, ...).")
    saved = gauge(f"{prefix}_energy_saved_joules", "Energy the lowered limits saved since the "
                  "jobs on this host started (the same work at the baseline draw, minus its "
                  "cost).")
    used = gauge(f"{prefix}_energy_used_joules",
                 "Energy those jobs' GPUs used since the jobs started here.")
    changes = counter(f"{prefix}_energy_limit_changes_total",
                      "Power limit calls by outcome (set, restore, failed).")
    if energy is not None:
        view = energy.view()
        for state in ENERGY_STATES:
            gpus.add(sum(1 for g in view["gpus"] if g["state"] == state),
                     state=state.replace(" ", "_"))
        saved.add(sum(j["saved_kj"] for j in view["jobs"]) * 1000)
        used.add(sum(j["used_kj"] for j in view["jobs"]) * 1000)
        for outcome in ("set", "restore", "failed"):
            changes.add(energy.changes.get(outcome, 0), outcome=outcome)
    return [gpus, saved, used, changes]
