"""A fake kernel log source for tests and the demo: a file written in /dev/kmsg's format.

The agent reads it in place of /dev/kmsg when its ``[observers.gpu] kmsg_path`` names
it (create the file before the agent starts: the agent starts reading at its end, as
it does /dev/kmsg). Each call appends one record (``PRI,SEQ,TS_USEC,FLAGS;MESSAGE``)
with the next sequence number, like the kernel:

* :meth:`FakeKernelLog.xid` writes the NVIDIA driver's XID line for a GPU, with the
  process it names (``pid=..., name=...``), ``'<unknown>'``, or no pid at all (the
  older drivers' form);
* ``facility=1`` (LOG_USER) is what a process writing to /dev/kmsg gets: a forgery the
  agent must not count;
* :meth:`FakeKernelLog.raw` appends any bytes (partial, interleaved, over-long lines).

The GPU's address is the fake NVML's (:func:`pci_bus_id`): the driver logs it as
``PCI:DDDD:BB:DD``.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent.kernel.kmsgformat import kmsg_line

#: native/fake_nvml's default PCI bus numbers of GPUs 0-7 (state.c, default_bus).
DEFAULT_BUS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)


def pci_bus_id(gpu: int) -> str:
    """The fake NVML's default bus id of a GPU, as NVML gives it."""
    return f"{gpu // 8:08X}:{DEFAULT_BUS[gpu % 8]:02X}:00.0"


class FakeKernelLog:
    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.touch()
        self.seq = 0

    def xid(self, gpu: int, xid: int, pid: int | None = None, name: str | None = None,
            *, unknown: bool = False, facility: int = 0) -> None:
        """The driver's line for an XID on the fake NVML's GPU ``gpu``."""
        domain, bus, _ = pci_bus_id(gpu).split(":")
        who = ("pid='<unknown>', name=<unknown>, " if unknown
               else f"pid={pid}, name={name or 'python'}, " if pid is not None else "")
        self.record(f"NVRM: Xid (PCI:{int(domain, 16):04x}:{bus.lower()}:00): {xid}, "
                    f"{who}Ch 00000010", facility=facility)

    def record(self, message: str, *, facility: int = 0) -> None:
        self.seq += 1
        self.raw(kmsg_line(self.seq, message, facility=facility, usec=self.seq * 1000))

    def raw(self, text: str) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(text)
