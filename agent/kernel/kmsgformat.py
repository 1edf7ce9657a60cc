"""The kernel's log records as /dev/kmsg gives them, and the NVIDIA driver's XID lines.

Plain parsing, no I/O (the GPU domain's sans-I/O attribution uses the types):
:mod:`agent.kernel.kmsg` reads the records. A record's first line is
``PRI,SEQ,TS_USEC,FLAGS[,more fields];MESSAGE`` (the kernel's
``Documentation/ABI/testing/dev-kmsg``); ``PRI`` is ``facility << 3 | level``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The kernel's own facility (kern): the only records that count.
KERN = 0

_HEADER = re.compile(r"(?P<pri>[0-9]{1,10}),(?P<seq>[0-9]{1,20}),(?P<usec>[0-9]{1,20}),"
                     r"(?P<flags>[^,;]{0,8})(?:,[^;]{0,256})?")
#: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, name=python, ...``; the older drivers'
#: forms have no ``PCI:`` prefix, no pid/name, or ``pid='<unknown>', name=<unknown>``.
#: The driver always writes text after the number: a line that ends there was cut.
_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<device>[0-9a-fA-F]{2})(?:\.[0-7])?\): (?P<xid>[0-9]{1,5}),"
    r"(?: pid=(?:'<unknown>'|(?P<pid>[0-9]{1,10}))(?:,|$))?"
    r"(?: name=(?:<unknown>|(?P<name>[^,]{1,64}))(?:,|$))?")

#: A GPU's PCI address as (domain, bus, device), the function left out: NVML writes
#: ``00000000:3B:00.0``, the driver's log ``0000:3b:00``.
PciKey = tuple[int, int, int]


def pci_key(bus_id: str) -> PciKey | None:
    parts = bus_id.strip().split(":")
    if len(parts) != 3:
        return None
    try:
        return int(parts[0], 16), int(parts[1], 16), int(parts[2].split(".")[0], 16)
    except ValueError:
        return None


@dataclass(frozen=True)
class KmsgRecord:
    facility: int
    level: int
    seq: int
    #: The kernel's timestamp (microseconds since boot).
    usec: int
    message: str


@dataclass(frozen=True)
class KernelXid:
    """An XID line of the driver's, as the kernel logged it."""

    pci: PciKey
    xid: int
    #: The process the driver tied the fault to (None: it names none, or '<unknown>').
    pid: int | None
    name: str | None
    seq: int


def parse_record(line: str) -> KmsgRecord | None:
    """One record's first line (no newline); None if it is not one."""
    header, sep, message = line.partition(";")
    match = _HEADER.fullmatch(header) if sep else None
    if match is None:
        return None
    pri = int(match["pri"])
    if pri >= 1 << 16:  # syslog facilities and levels fit easily; a bigger one is garbage
        return None
    return KmsgRecord(pri >> 3, pri & 7, int(match["seq"]), int(match["usec"]), message)


def parse_xid(message: str) -> tuple[PciKey, int, int | None, str | None] | None:
    match = _XID.search(message)
    if match is None:
        return None
    pci = (int(match["domain"], 16), int(match["bus"], 16), int(match["device"], 16))
    pid = int(match["pid"]) if match["pid"] else None
    return pci, int(match["xid"]), pid, match["name"]


def kmsg_line(seq: int, message: str, *, facility: int = KERN, level: int = 3,
              usec: int = 0) -> str:
    """A record in /dev/kmsg's format (what a fake kernel log source writes)."""
    return f"{facility << 3 | level},{seq},{usec},-;{message}\n"
