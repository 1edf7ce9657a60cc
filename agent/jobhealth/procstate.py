"""A process's state from ``/proc/PID/stat``: the kernel's state letter and start time.

The pid comes from a tenant's stats file, so it is a claim: the file is read bounded,
never followed anywhere else, and the start time (field 22, clock ticks since boot) tells
a process from a later one that reuses its pid. A process that vanishes mid-read, or
whose file is malformed, is ``None`` (gone or unknown), never an exception.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from harmonaize.messages.jobhealth import ProcessState

#: /proc/PID/stat is one line of a few hundred bytes; its command name is at most 64.
MAX_STAT = 4096

LETTERS = {
    "R": ProcessState.RUNNING, "S": ProcessState.SLEEPING, "I": ProcessState.SLEEPING,
    "D": ProcessState.UNINTERRUPTIBLE, "T": ProcessState.STOPPED, "t": ProcessState.STOPPED,
    "Z": ProcessState.ZOMBIE, "X": ProcessState.ZOMBIE, "x": ProcessState.ZOMBIE,
}


@dataclass(frozen=True)
class ProcStat:
    state: ProcessState
    #: Clock ticks after boot when the process started: its identity with the pid.
    start_time: int


def parse_stat(data: bytes) -> ProcStat | None:
    """The state and start time of one ``stat`` line (None: malformed)."""
    _, paren, rest = data.rpartition(b")")  # the command name may hold ")" itself
    if not paren:
        return None
    fields = rest.split()
    if len(fields) < 20:
        return None
    try:
        start = int(fields[19])
        letter = fields[0].decode("ascii")
    except (ValueError, UnicodeDecodeError):
        return None
    return ProcStat(LETTERS.get(letter, ProcessState.UNKNOWN), start)


def read_stat(pid: int, proc_root: str | os.PathLike[str] = "/proc") -> ProcStat | None:
    """``pid``'s state now; None when there is no such process (or it just went)."""
    if pid <= 0:
        return None
    path = f"{os.fspath(proc_root)}/{pid}/stat"  # not pathlib: read for every still rank
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, MAX_STAT)
    except OSError:  # ESRCH: it exited between the open and the read
        return None
    finally:
        os.close(fd)
    return parse_stat(data)
