"""Reading network devices and kernel counters from sysfs and procfs.

Every path goes through a root (``/sys``, ``/proc`` by default) so tests can
point the readers at fixture trees. Parsers are pure functions over text.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

ARPHRD_ETHER = 1
ARPHRD_NONE = 65534


@dataclass(frozen=True)
class NetDevice:
    name: str
    ifindex: int
    type: int
    #: Backed by hardware (has a ``device`` link), as opposed to veth, bridges, tunnels.
    physical: bool
    #: The NIC also has an RDMA (InfiniBand/RoCE) device.
    rdma: bool
    operstate: str

    @property
    def up(self) -> bool:
        # "unknown" is what many virtual and some physical drivers report while working.
        return self.operstate in ("up", "unknown")

    @property
    def l2_len(self) -> int:
        """Bytes before the IP header as tc sees the packet."""
        return 14 if self.type == ARPHRD_ETHER else 0


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def list_devices(sys_root: str | Path = "/sys") -> list[NetDevice]:
    base = Path(sys_root) / "class" / "net"
    devices = []
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    for entry in entries:
        ifindex = _read_int(entry / "ifindex")
        if ifindex is None:
            continue
        devices.append(
            NetDevice(
                name=entry.name,
                ifindex=ifindex,
                type=_read_int(entry / "type") or 0,
                physical=(entry / "device").exists(),
                rdma=(entry / "device" / "infiniband").is_dir(),
                operstate=_read(entry / "operstate") or "unknown",
            )
        )
    return devices


def read_speed(sys_root: str | Path, name: str) -> int | None:
    """Link speed in Mb/s, or None when unknown (down links report an error or -1)."""
    speed = _read_int(Path(sys_root) / "class" / "net" / name / "speed")
    return speed if speed is not None and speed > 0 else None


@dataclass(frozen=True)
class DevCounters:
    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_drops: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_drops: int


def parse_proc_net_dev(text: str) -> dict[str, DevCounters]:
    """Parse ``/proc/net/dev``: two header lines, then ``name: 16 numbers``."""
    out: dict[str, DevCounters] = {}
    for line in text.splitlines()[2:]:
        name, sep, rest = line.partition(":")
        if not sep:
            continue
        fields = rest.split()
        if len(fields) < 16:
            continue
        try:
            v = [int(f) for f in fields[:16]]
        except ValueError:
            continue
        out[name.strip()] = DevCounters(v[0], v[1], v[2], v[3], v[8], v[9], v[10], v[11])
    return out


def parse_snmp(text: str) -> dict[str, dict[str, int]]:
    """Parse ``/proc/net/snmp`` or ``/proc/net/netstat``: pairs of header and value lines."""
    out: dict[str, dict[str, int]] = {}
    lines = text.splitlines()
    for header, values in zip(lines[::2], lines[1::2], strict=False):
        prefix, _, names = header.partition(":")
        vprefix, _, nums = values.partition(":")
        if prefix != vprefix:
            continue
        table = out.setdefault(prefix.strip(), {})
        for key, value in zip(names.split(), nums.split(), strict=False):
            with contextlib.suppress(ValueError):
                table[key] = int(value)
    return out


def snmp_value(text: str, prefix: str, name: str) -> int | None:
    """One counter of ``/proc/net/snmp``, without parsing the rest."""
    tag = prefix + ":"
    header = None
    for line in text.splitlines():
        if not line.startswith(tag):
            continue
        if header is None:
            header = line.split()
            continue
        try:
            return int(line.split()[header.index(name)])
        except (ValueError, IndexError):
            return None
    return None


class ProcFile:
    """A procfs or sysfs file kept open and re-read from offset 0 (the kernel regenerates it).

    Saves the open/close and path handling of reading it afresh every interval.
    A file that cannot be read reads as empty; it is reopened on the next call.
    """

    def __init__(self, root: str | Path, *parts: str) -> None:
        self.path = str(Path(root).joinpath(*parts))
        self._fd: int | None = None
        self._size = 16384

    def read(self) -> str:
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            while True:
                data = os.pread(self._fd, self._size, 0)
                if len(data) < self._size:
                    return data.decode("ascii", "replace")
                self._size *= 2  # did not fit: read again with room to spare
        except OSError:
            self.close()
            return ""

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


def read_text(root: str | Path, *parts: str) -> str:
    """Read a file under ``root``; missing files read as empty."""
    return _read(Path(root).joinpath(*parts)) or ""
