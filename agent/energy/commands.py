"""The energy domain's operator command: ``energy`` (power limits the energy loop set,
what they saved, and why)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from harmonaize.opsocket import Command

if TYPE_CHECKING:
    from agent.energy.service import EnergyService


class Shell(Protocol):
    energy: EnergyService | None


def commands(shell: Shell) -> dict[str, Command]:
    return {
        "energy": Command(lambda args: energy_view(shell),
                          "power limits per GPU: set, original, draw, energy saved, why"),
    }


def energy_view(shell: Shell) -> dict[str, Any]:
    if shell.energy is None:
        return {"enabled": False, "gpus": [], "jobs": [], "changes": {}, "left_lowered": []}
    return shell.energy.view()
