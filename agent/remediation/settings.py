"""Remediation's settings (``[remediation]``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, ClassVar

from harmonaize.config import AbsPath
from harmonaize.schema import Len, Num, Str


class RemediationMode(StrEnum):
    SHADOW = "shadow"  # log what would be done, do nothing
    ACT = "act"


@dataclass(frozen=True)
class RemediationSection:
    """Resets of quarantined GPUs, and the reboot and RMA holds after them
    (agent/remediation); needs validation, which decides after each step."""

    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = False
    mode: RemediationMode = RemediationMode.SHADOW
    #: The reset command; {gpu} is the GPU's index, {pci_bus_id} its PCI bus id, {uuid}.
    #: NVML has no public reset call: nvidia-smi's is the driver's supported way.
    reset_command: Annotated[tuple[Annotated[str, Str(max_len=1024, min_len=1)], ...],
                             Len(64, min_len=1)] = (
        "nvidia-smi", "--gpu-reset", "-i", "{pci_bus_id}")
    #: Seconds before a reset command is killed and counted as failed.
    reset_timeout: Annotated[float, Num(1.0, 3600.0)] = 120.0
    #: Failed resets (the command failed, or validation failed after it) before the
    #: scheduler is asked to reboot the host.
    max_resets: Annotated[int, Num(1, 100)] = 2
    #: Seconds between two resets of one GPU at least.
    reset_interval: Annotated[float, Num(0.0, 7 * 86400.0)] = 600.0
    #: Resets on this host within any hour at most.
    max_resets_per_hour: Annotated[int, Num(1, 1000)] = 4
    #: Where the boot id is read: another id than at the reboot request means the host
    #: rebooted.
    boot_id_file: AbsPath = "/proc/sys/kernel/random/boot_id"

    def __post_init__(self) -> None:
        try:
            render_reset(self.reset_command, 0, "00000000:00:00.0", "GPU-0")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"reset_command: unknown placeholder {exc} (use {{gpu}}, "
                             "{pci_bus_id} or {uuid})") from None


def render_reset(argv: tuple[str, ...], gpu: int, pci_bus_id: str, uuid: str) -> list[str]:
    values = {"gpu": str(gpu), "pci_bus_id": pci_bus_id, "uuid": uuid}
    return [part.format_map(values) for part in argv]
