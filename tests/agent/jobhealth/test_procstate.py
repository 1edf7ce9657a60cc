"""A rank's process state read from /proc, against real processes: a stopped child, a
zombie, one that exited; malformed and vanishing entries give None, never a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.jobhealth.procstate import MAX_STAT, parse_stat, read_stat
from harmonaize.messages import ProcessState
from tests.daemons import wait_until

pytestmark = pytest.mark.jobhealth


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def test_item1_a_sleeping_then_sigstopped_child_reads_as_stopped(child) -> None:
    wait_until(lambda: (s := read_stat(child.pid)) and s.state is ProcessState.SLEEPING,
               timeout=10, what="the child asleep")
    start = read_stat(child.pid).start_time  # type: ignore[union-attr]
    os.kill(child.pid, signal.SIGSTOP)
    stat = wait_until(lambda: (s := read_stat(child.pid)) and s.state is ProcessState.STOPPED
                      and s, timeout=10, what="the child stopped")
    assert stat.start_time == start  # the same process: its start time is its identity
    os.kill(child.pid, signal.SIGCONT)


def test_item1_a_zombie_reads_as_zombie_and_an_exited_process_as_gone(child) -> None:
    child.kill()
    # Not reaped yet: the kernel keeps it as a zombie.
    wait_until(lambda: (s := read_stat(child.pid)) and s.state is ProcessState.ZOMBIE,
               timeout=10, what="the zombie")
    child.wait()
    assert read_stat(child.pid) is None


def test_item5_a_command_name_with_parentheses_and_spaces_cannot_shift_the_fields() -> None:
    tail = b" ".join([b"T", *[b"1"] * 18, b"4242", b"0"])
    assert parse_stat(b"77 (evil) R 1 2) " + tail) == parse_stat(b"77 (x) " + tail)
    assert parse_stat(b"77 (x) " + tail).start_time == 4242  # type: ignore[union-attr]


@pytest.mark.parametrize("data", [b"", b"77 (x", b"77 (x) R 1 2", b"77 (x) " + b"R " * 19 + b"z",
                                  b"\xff" * MAX_STAT])
def test_item5_malformed_stat_lines_are_unknown_not_an_exception(data: bytes) -> None:
    assert parse_stat(data) is None


def test_item5_a_pid_with_no_process_and_a_link_in_a_fake_proc_are_not_followed(
        tmp_path: Path) -> None:
    assert read_stat(0) is None and read_stat(-5) is None
    (tmp_path / "55").mkdir()
    (tmp_path / "elsewhere").write_bytes(b"55 (x) R " + b"1 " * 18 + b"9\n")
    (tmp_path / "55" / "stat").symlink_to(tmp_path / "elsewhere")
    assert read_stat(55, tmp_path) is None
