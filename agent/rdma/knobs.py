"""Reading and writing a RoCE NIC's DCQCN settings, in either layout hosts have.

* ``sysfs`` (MLNX_OFED): ``<sysfs>/class/net/<if>/ecn/roce_rp/<name>``,
  ``.../roce_np/<name>``, and per priority ``.../roce_{rp,np}/enable/<0-7>``;
* ``debugfs`` (upstream mlx5): ``<debugfs>/mlx5/<pci function>/cc_params/<name>``,
  no per-priority enable files (those stay the firmware's).

Both roots are configurable, so tests run on fixture trees. Every path this
module writes is built from a known parameter name under one of the two roots;
:func:`allowed_path` checks a path read back from the originals file the same way.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.rdma.ccparams import PARAMS, parse_enable_knob
from agent.rdma.settings import CcLayout

_PCI = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_NAME = re.compile(r"[A-Za-z0-9_.:@+-]{1,64}")


class KnobError(OSError):
    """A value could not be read or written; the message says which and why."""


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    try:
        return int(text, 0)
    except ValueError:
        return None


def pci_function(sysfs_root: str | Path, netdev: str) -> str | None:
    """The net device's PCI function (``0000:3b:00.0``), from its ``device`` link or uevent."""
    device = Path(sysfs_root) / "class" / "net" / netdev / "device"
    try:
        name = os.path.basename(os.readlink(device))
        if _PCI.fullmatch(name):
            return name
    except OSError:
        pass
    try:
        for line in (device / "uevent").read_text().splitlines():
            key, _, value = line.partition("=")
            if key == "PCI_SLOT_NAME" and _PCI.fullmatch(value.strip()):
                return value.strip()
    except (OSError, UnicodeDecodeError):
        pass
    return None


@dataclass(frozen=True)
class CcDevice:
    """Where one net device's DCQCN settings live."""

    netdev: str
    layout: str  # "sysfs" or "debugfs"
    base: Path

    def path(self, knob: str) -> Path | None:
        """The file of a parameter or an enable flag; None if this layout has none."""
        enable = parse_enable_knob(knob)
        if self.layout == "sysfs":
            if enable is not None:
                return self.base / f"roce_{enable[0]}" / "enable" / str(enable[1])
            param = PARAMS.get(knob)
            return self.base / f"roce_{param.point}" / knob if param else None
        if enable is not None:
            return None
        param = PARAMS.get(knob)
        return self.base / param.debugfs if param else None

    def read(self, knob: str) -> int | None:
        path = self.path(knob)
        return _read_int(path) if path is not None else None

    def write(self, knob: str, value: int) -> Path:
        path = self.path(knob)
        if path is None:
            raise KnobError(f"{self.netdev}: {knob} has no file in the {self.layout} layout")
        write_value(path, value)
        return path


def write_value(path: Path, value: int) -> None:
    try:
        # Opened for writing only, never created: a missing attribute is an error.
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, f"{value}\n".encode())
        finally:
            os.close(fd)
    except OSError as exc:
        raise KnobError(f"writing {value} to {path}: {exc.strerror or exc}") from None


def find(sysfs_root: str | Path, debugfs_root: str | Path, netdev: str,
         layout: CcLayout) -> CcDevice | str:
    """The device's settings in the wanted layout, or why there are none (one line)."""
    if not _NAME.fullmatch(netdev):
        return f"{netdev!r} is not a net device name"
    if not (Path(sysfs_root) / "class" / "net" / netdev).is_dir():
        return f"no net device {netdev} (nor an RDMA device of that name with one)"
    sysfs = Path(sysfs_root) / "class" / "net" / netdev / "ecn"
    if layout in (CcLayout.AUTO, CcLayout.SYSFS) and (sysfs / "roce_rp").is_dir():
        return CcDevice(netdev, "sysfs", sysfs)
    if layout is CcLayout.SYSFS:
        return f"{sysfs}/roce_rp is missing (MLNX_OFED's DCQCN tree)"
    pci = pci_function(sysfs_root, netdev)
    if pci is None:
        return f"{netdev}: no PCI function found for its debugfs cc_params"
    debugfs = Path(debugfs_root) / "mlx5" / pci / "cc_params"
    if debugfs.is_dir():
        return CcDevice(netdev, "debugfs", debugfs)
    if layout is CcLayout.DEBUGFS:
        return f"{debugfs} is missing (is debugfs mounted?)"
    return f"{netdev}: neither {sysfs}/roce_rp nor {debugfs} exists"


def allowed_path(path: str, sysfs_root: str | Path, debugfs_root: str | Path) -> bool:
    """Whether ``path`` is a DCQCN setting under one of the roots (for values read back
    from the originals file: nothing else is ever written)."""
    candidate = Path(path)
    if ".." in candidate.parts or not candidate.is_absolute():
        return False
    for base, shape in ((Path(sysfs_root) / "class" / "net", "sysfs"),
                        (Path(debugfs_root) / "mlx5", "debugfs")):
        try:
            rest = candidate.relative_to(base).parts
        except ValueError:
            continue
        if shape == "sysfs" and len(rest) in (4, 5) and rest[1] == "ecn" \
                and rest[2] in ("roce_rp", "roce_np"):
            if len(rest) == 4 and rest[3] in PARAMS:
                return True
            if len(rest) == 5 and rest[3] == "enable" and rest[4] in "01234567" \
                    and len(rest[4]) == 1:
                return True
        if shape == "debugfs" and len(rest) == 3 and rest[1] == "cc_params" \
                and rest[2] in {p.debugfs for p in PARAMS.values()}:
            return True
    return False
