"""What remediation knows of a GPU, what it asks for, and its settings. No I/O here."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Phase(StrEnum):
    """Where one GPU's remediation stands (the table in agent/remediation/engine.py)."""

    WAITING = "waiting"            # quarantined for a reset: waits until idle and allowed
    RESETTING = "resetting"        # the reset command runs
    REVALIDATING = "revalidating"  # reset done: a validation decides
    REBOOT = "reboot"              # resets did not help: the scheduler is asked to reboot
    AFTER_REBOOT = "after-reboot"  # the host rebooted: a validation decides
    RMA = "rma"                    # latched: only an operator clears it
    CANCELLED = "cancelled"        # an operator stopped remediating this GPU


class Step(StrEnum):
    """The steps recorded in the validation history (``remediation`` table)."""

    RESET = "reset"
    RESET_DONE = "reset-done"
    RESET_FAILED = "reset-failed"
    REVALIDATION_FAILED = "revalidation-failed"
    RELEASED = "released"
    REBOOT = "reboot"
    REBOOTED = "rebooted"
    RMA = "rma"
    CANCELLED = "cancelled"
    RESUMED = "resumed"
    CLEARED = "cleared"


@dataclass(frozen=True)
class GpuSeen:
    """One GPU as remediation needs it, from the health engine's view."""

    index: int
    uuid: str
    pci_bus_id: str
    state: str          # the health engine's state: healthy, quarantined, ...
    action: str         # its recommended action: reset-gpu, drain, ...
    why: str            # why it is in that state (what triggers a reset)
    #: Processes on it, as NVML lists them; None when they could not be read (busy then).
    processes: int | None


@dataclass(frozen=True)
class Record:
    """One GPU's remediation, persisted by UUID (survives restarts and reboots)."""

    uuid: str
    gpu: int
    phase: Phase
    failures: int = 0
    since: float = 0.0
    #: The boot the reboot was asked in (REBOOT): another boot means it happened.
    boot_id: str = ""
    last_reset: float = float("-inf")
    detail: str = ""


@dataclass(frozen=True)
class Reset:
    """Run the reset command for this GPU now."""

    uuid: str
    gpu: int
    pci_bus_id: str


@dataclass(frozen=True)
class Validate:
    """Ask validation to look at this GPU (trigger: what for)."""

    gpu: int
    trigger: str


@dataclass(frozen=True)
class Log:
    """A step for the history: what happened and what triggered it."""

    uuid: str
    gpu: int
    step: Step
    trigger: str
    detail: str = ""


@dataclass(frozen=True)
class Would:
    """Shadow mode: what would be done (logged once, nothing done)."""

    gpu: int
    what: str


Action = Reset | Validate | Log | Would


@dataclass(frozen=True)
class Settings:
    shadow: bool = True
    #: Failed resets (the command failed, or validation failed after it) before a reboot.
    max_resets: int = 2
    #: Seconds between two resets of one GPU at least.
    reset_interval: float = 600.0
    #: Resets on the host within any hour at most.
    max_resets_per_hour: int = 4
