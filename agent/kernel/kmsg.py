"""The kernel's log as /dev/kmsg exposes it, and the NVIDIA driver's XID lines in it.

Each read of /dev/kmsg returns one record (the kernel's
``Documentation/ABI/testing/dev-kmsg``)::

    PRI,SEQ,TS_USEC,FLAGS[,more fields];MESSAGE\\n
     KEY=VALUE\\n                      (continuation lines: the record's dictionary)

``PRI`` is ``facility << 3 | level``; ``SEQ`` rises by one per record, and a jump says
records were lost; a reader that fell so far behind that its next record was
overwritten gets ``EPIPE`` once and continues with the oldest record still there.

Only the kernel's own records count: facility 0 (kern). A process that writes to
/dev/kmsg gets its record stamped LOG_USER (facility 1) unless its ``<N>`` prefix names
a non-zero facility itself (``devkmsg_write`` in the kernel's ``printk.c``: facility
starts as LOG_USER and is replaced only by a prefix's non-zero facility bits), so no
process, root's included, can make a record of facility 0 through /dev/kmsg. A line
claiming to be the driver's from any other facility is counted and skipped.

The source is read the same way from a FIFO or a regular file written in this format
(tests and the demo: ``[observers.gpu] kmsg_path``): records are split at newlines, so
a chunk holding many records or half of one reads alike. Everything read is
untrusted: lines are bounded, malformed ones (partial, interleaved, over-long) are
skipped and counted, never raised; each pass reads at most ``max_records`` records and
``max_bytes`` bytes.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from dataclasses import dataclass, field

from agent.kernel.kmsgformat import KERN, KernelXid, kmsg_line, parse_record, parse_xid, pci_key

log = logging.getLogger("harmonaize.agent")

#: The kernel's record limit for /dev/kmsg readers (CONSOLE_EXT_LOG_MAX): one read
#: returns one record, and a buffer smaller than a record fails with EINVAL.
READ_SIZE = 8192
#: A line longer than this is not a record we act on (the kernel's are far shorter).
MAX_LINE = 4096

__all__ = ["KernelXid", "KmsgCounts", "KmsgSource", "kmsg_line", "pci_key"]


@dataclass
class KmsgCounts:
    records: int = 0
    xids: int = 0
    #: Records not of the kernel's own facility (processes' writes: journald's, a
    #: forgery's), never taken for the driver's.
    not_kernel: int = 0
    #: Lines that are no record (partial, interleaved, garbage) or replayed numbers.
    malformed: int = 0
    overlong: int = 0
    #: Records overwritten before we read them (EPIPE, or a jump in SEQ).
    lost: int = 0
    errors: int = 0


@dataclass
class KmsgSource:
    """A non-blocking reader of /dev/kmsg (or a file or FIFO in its format)."""

    path: str = "/dev/kmsg"
    #: Start at the end (only records logged from now on) or at the oldest record.
    from_start: bool = False
    max_records: int = 256
    max_bytes: int = 256 * 1024
    counts: KmsgCounts = field(default_factory=KmsgCounts)
    _fd: int | None = None
    _pending: bytes = b""
    _skip_line: bool = False  # inside an over-long line: drop up to its newline
    _last_seq: int | None = None
    _device: bool = False

    def open(self) -> None:
        # O_NOFOLLOW: the path is the operator's, but a link there is never followed.
        self._fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
                           | os.O_NOFOLLOW)
        # /dev/kmsg returns one whole record per read and refuses a smaller buffer
        # (EINVAL): read it whole; a file or FIFO is read within the byte budget.
        self._device = stat.S_ISCHR(os.fstat(self._fd).st_mode)
        if not self.from_start:
            try:
                os.lseek(self._fd, 0, os.SEEK_END)
            except OSError as exc:  # a FIFO: ESPIPE, it has only new records anyway
                if exc.errno != errno.ESPIPE:
                    raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self) -> list[KernelXid]:
        """The driver's XID records logged since the last call (bounded per call)."""
        if self._fd is None:
            return []
        found: list[KernelXid] = []
        budget, records = self.max_bytes, 0
        while budget > 0 and records < self.max_records:
            try:
                chunk = os.read(self._fd, READ_SIZE if self._device else min(READ_SIZE, budget))
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before we read it: go on
                    self.counts.lost += 1
                    records += 1  # a log overwritten as fast as we read still ends
                    continue
                self.counts.errors += 1
                log.warning("kernel log %s: %s", self.path, exc.strerror or exc)
                break
            if not chunk:
                break  # end of a file, or a FIFO with no writer
            budget -= len(chunk)
            for line in self._lines(chunk):
                records += 1
                xid = self._record(line)
                if xid is not None:
                    found.append(xid)
        return found

    def _lines(self, chunk: bytes) -> list[bytes]:
        data = self._pending + chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        out = []
        for line in lines:
            if self._skip_line:
                self._skip_line = False  # the tail of an over-long line
                continue
            if len(line) > MAX_LINE:
                self.counts.overlong += 1
                continue
            out.append(line)
        if len(self._pending) > MAX_LINE:
            self.counts.overlong += not self._skip_line
            self._pending, self._skip_line = b"", True
        return out

    def _record(self, raw: bytes) -> KernelXid | None:
        if raw.startswith(b" "):
            return None  # a continuation line: the dictionary of the record before
        record = parse_record(raw.decode("utf-8", "replace"))
        if record is None:
            self.counts.malformed += 1
            return None
        if self._last_seq is not None and record.seq <= self._last_seq:
            self.counts.malformed += 1  # replayed or interleaved: numbers only rise
            return None
        if self._last_seq is not None and record.seq > self._last_seq + 1:
            self.counts.lost += record.seq - self._last_seq - 1
        self._last_seq = record.seq
        self.counts.records += 1
        if record.facility != KERN:  # a process's write (journald's, or a forgery)
            self.counts.not_kernel += 1
            return None
        if "NVRM: Xid" not in record.message:
            return None
        parsed = parse_xid(record.message)
        if parsed is None:
            self.counts.malformed += 1
            return None
        self.counts.xids += 1
        return KernelXid(*parsed, seq=record.seq)
