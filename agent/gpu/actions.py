"""What an operator should do about a GPU problem, from least to most disruptive."""

from __future__ import annotations

from enum import StrEnum


class Action(StrEnum):
    NONE = "none"
    RESTART_APP = "restart-application"
    RESET_GPU = "reset-gpu"
    DRAIN = "drain"
    REBOOT_NODE = "reboot-node"
    RMA = "rma"

    @property
    def rank(self) -> int:
        return _ORDER.index(self)


_ORDER = list(Action)


def worst(actions: list[Action] | tuple[Action, ...]) -> Action:
    return max(actions, key=lambda a: a.rank, default=Action.NONE)


#: NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values (driver r570+).
RECOVERY_ACTIONS = {
    0: Action.NONE,
    1: Action.RESET_GPU,     # GPU reset
    2: Action.REBOOT_NODE,   # node reboot
    3: Action.DRAIN,         # drain peer-to-peer traffic, then re-query
    4: Action.RESET_GPU,     # drain and reset (running at reduced capacity)
    5: Action.RESET_GPU,     # recover the IMEX domain
    6: Action.REBOOT_NODE,   # bus reset
    7: Action.REBOOT_NODE,   # system reboot
}
