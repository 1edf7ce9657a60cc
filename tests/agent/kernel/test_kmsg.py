"""The kernel log source: /dev/kmsg's record format, the driver's XID lines in their
documented forms, and what a tenant could write there (forged, partial, interleaved,
over-long lines), read from real files and FIFOs."""

from __future__ import annotations

import contextlib
import errno
import os
from pathlib import Path

import pytest

from agent.kernel.kmsg import MAX_LINE, KmsgSource, kmsg_line, pci_key
from agent.kernel.kmsgformat import parse_record

pytestmark = pytest.mark.jobhealth

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kmsg"


def expected() -> list[tuple[str, str, int, int | None, str | None]]:
    rows = []
    for line in (FIXTURES / "expected.txt").read_text().splitlines():
        name, pci, xid, pid, proc = line.split()
        rows.append((name, pci, int(xid), None if pid == "-" else int(pid),
                     None if proc == "-" else proc))
    return rows


@pytest.mark.parametrize(("name", "pci", "xid", "pid", "proc"), expected())
def test_every_documented_xid_line_format_parses(name: str, pci: str, xid: int,
                                                 pid: int | None, proc: str | None) -> None:
    source = KmsgSource(str(FIXTURES / name), from_start=True)
    source.open()
    try:
        found = source.read()
    finally:
        source.close()
    assert [(f.pci, f.xid, f.pid, f.name) for f in found] == [(pci_key(pci), xid, pid, proc)]
    assert source.counts.malformed == 0


def write(path: Path, text: str) -> None:
    with path.open("a") as f:
        f.write(text)


def test_starts_at_the_end_and_reads_only_new_records(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    write(log, kmsg_line(1, "NVRM: Xid (PCI:0000:3b:00): 31, pid=10, name=a, Ch 1"))
    source = KmsgSource(str(log))
    source.open()
    try:
        assert source.read() == []
        write(log, kmsg_line(2, "NVRM: Xid (PCI:0000:3b:00): 13, pid=11, name=b, Graphics"))
        assert [(x.xid, x.pid) for x in source.read()] == [(13, 11)]
    finally:
        source.close()


def test_a_forged_facility_is_counted_and_never_an_xid(tmp_path: Path) -> None:
    """A process's write to /dev/kmsg is stamped LOG_USER (facility 1) or its own
    non-zero facility: a driver-like line there is a forgery."""
    log = tmp_path / "kmsg"
    write(log, kmsg_line(1, "NVRM: Xid (PCI:0000:3b:00): 31, pid=10, name=a,", facility=1))
    write(log, kmsg_line(2, "NVRM: Xid (PCI:0000:3b:00): 31, pid=10, name=a,", facility=23))
    source = KmsgSource(str(log), from_start=True)
    source.open()
    try:
        assert source.read() == []
    finally:
        source.close()
    assert source.counts.not_kernel == 2


def test_partial_interleaved_and_garbage_lines_are_skipped_and_counted(
        tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    good = "NVRM: Xid (PCI:0000:3b:00): 45, pid=12, name=c, Ch 2"
    write(log, "3,1,0,-;NVRM: Xid (PCI:0000:3b:00): 3")      # cut short: no newline yet
    write(log, "\n3,2,0-;NVRM: Xid (PCI:0000:3b:00): 31,\n")  # header broken
    write(log, "3,1,0,-;NVRM: Xid (PCI:0000:3b:00): 13,\n")   # a replayed number
    write(log, "just text\n\x00\xff\n")
    write(log, kmsg_line(3, "NVRM: Xid (PCI:zzzz): 31, pid=1"))  # not the driver's form
    write(log, kmsg_line(4, good))
    source = KmsgSource(str(log), from_start=True)
    source.open()
    try:
        found = source.read()
    finally:
        source.close()
    assert [(x.xid, x.pid) for x in found] == [(45, 12)]
    # The cut line and the two that follow were not records; the replay is refused.
    assert source.counts.malformed >= 5


def test_a_half_written_record_completes_at_the_next_read(tmp_path: Path) -> None:
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    source = KmsgSource(str(fifo))
    source.open()
    writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        line = kmsg_line(7, "NVRM: Xid (PCI:0000:3b:00): 43, pid=99, name=d, Ch 3").encode()
        os.write(writer, line[:20])
        assert source.read() == []  # no newline yet, no EAGAIN-induced error
        os.write(writer, line[20:])
        assert [(x.xid, x.pid) for x in source.read()] == [(43, 99)]
        assert source.counts.errors == 0
    finally:
        os.close(writer)
        source.close()


def test_an_over_long_line_is_dropped_whole(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    write(log, kmsg_line(1, "NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=" + "x" * MAX_LINE))
    write(log, kmsg_line(2, "NVRM: Xid (PCI:0000:3b:00): 13, pid=2, name=e, Ch"))
    source = KmsgSource(str(log), from_start=True, max_bytes=MAX_LINE // 2)
    source.open()
    try:
        found: list = []
        for _ in range(8):  # bounded passes: each reads at most max_bytes
            found += source.read()
    finally:
        source.close()
    assert [(x.xid, x.pid) for x in found] == [(13, 2)]
    assert source.counts.overlong == 1


def test_each_pass_is_bounded_in_records(tmp_path: Path) -> None:
    log = tmp_path / "kmsg"
    write(log, "".join(kmsg_line(n, f"NVRM: Xid (PCI:0000:3b:00): 13, pid={n}, name=f,")
                       for n in range(1, 101)))
    source = KmsgSource(str(log), from_start=True, max_records=10, max_bytes=600)
    source.open()
    try:
        first = source.read()
        rest = [x for _ in range(100) for x in source.read()]
    finally:
        source.close()
    assert 0 < len(first) <= 10
    assert len(first) + len(rest) == 100


class _Epipe:
    """A read that fails once with EPIPE, as /dev/kmsg does for overwritten records."""

    def __init__(self, real) -> None:
        self.real, self.failed = real, False

    def __call__(self, fd: int, n: int) -> bytes:
        if not self.failed:
            self.failed = True
            raise OSError(errno.EPIPE, "Broken pipe")
        return self.real(fd, n)


def test_overwritten_records_epipe_and_gaps_are_counted_not_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "kmsg"
    write(log, kmsg_line(5, "NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=g,"))
    write(log, kmsg_line(9, "NVRM: Xid (PCI:0000:3b:00): 13, pid=2, name=g,"))
    source = KmsgSource(str(log), from_start=True)
    source.open()
    monkeypatch.setattr(os, "read", _Epipe(os.read))
    try:
        found = source.read()
    finally:
        monkeypatch.undo()
        source.close()
    assert [x.xid for x in found] == [31, 13]
    assert source.counts.lost == 1 + 3  # the EPIPE, and seq 6..8


def test_a_link_at_the_path_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "real"
    write(target, kmsg_line(1, "NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=h,"))
    (tmp_path / "kmsg").symlink_to(target)
    with pytest.raises(OSError):
        KmsgSource(str(tmp_path / "kmsg")).open()


def test_the_kernel_stamps_a_process_write_to_dev_kmsg_with_a_user_facility() -> None:
    """The claim the reader rests on, checked against the running kernel: a process
    that writes ``<6>`` (facility bits 0) to /dev/kmsg gets LOG_USER, not the kernel's
    facility, so no line it writes can pass for the driver's. (The line written is no
    XID line: tools on the host that grep the kernel log for XIDs must not see one.)"""
    try:
        reader = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        pytest.skip(f"/dev/kmsg is not readable here: {exc.strerror}")
    try:
        os.lseek(reader, 0, os.SEEK_END)
        try:
            writer = os.open("/dev/kmsg", os.O_WRONLY)
        except OSError as exc:
            pytest.skip(f"/dev/kmsg is not writable here: {exc.strerror}")
        text = f"harmonaize test {os.getpid()}: a process's record, no fault"
        try:
            os.write(writer, f"<6>{text}\n".encode())
        finally:
            os.close(writer)
        ours = []
        with contextlib.suppress(BlockingIOError):
            while not ours:
                line = os.read(reader, 8192).decode("utf-8", "replace").split("\n")[0]
                ours = [r for r in [parse_record(line)] if r and r.message == text]
    finally:
        os.close(reader)
    if not ours:
        pytest.skip("this kernel drops writes to /dev/kmsg (printk.devkmsg=off)")
    assert (ours[0].facility, ours[0].level) == (1, 6)  # LOG_USER, never the kernel's 0
