"""The stats files the tuner plugin writes, read while their writers live.

Each rank's process reports per communicator what it follows and where it switched in
``<dir>/<job>/<pid>-<tag>.stats``, holding a shared lock on the file for as long as it
lives. The files are a tenant's in number and content: every open goes through
:mod:`agent.plugin.hostilefs`, and :class:`StatsReader` reads them with bounded work
per call (:class:`StatsLimits`); a slot read mid-update is retried a bounded number of
times (its seqlock), then left for the next look.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from agent.plugin.hostilefs import HeldDir, Refused
from agent.plugin.layout import (
    STATS_HEADER,
    STATS_HEADER_SIZE,
    STATS_MAGIC,
    STATS_NAME,
    STATS_SIZE,
    STATS_SLOT_SIZE,
    STATS_SLOTS,
    STATS_VERSION,
    StatsSlot,
    StatsSlots,
    parse_slot,
    validate_job,
)

log = logging.getLogger(__name__)


def job_dir(directory: str | os.PathLike[str], job: str) -> Path:
    """A job's directory under the plugin's root (the name checked as the plugin does)."""
    return Path(directory) / validate_job(job)


@dataclass(frozen=True)
class StatsLimits:
    """How much of a job's stats files one read may look at (the files are a tenant's).

    ``per_job`` and ``per_uid`` cap the files considered at all (the excess is counted
    and ignored; a file once admitted stays admitted while it exists, so files made later
    cannot push out a rank's); ``per_read`` caps the files read by one call (the others
    are read by the next calls, in turn, their last reading standing in meanwhile);
    ``seqlock_tries`` caps the reads of a file whose slots stay mid-update (such a slot is
    then stale: its last reading stands, or it is left out)."""

    per_job: int = 256
    per_uid: int = 64
    per_read: int = 32
    seqlock_tries: int = 4


@dataclass
class _Admitted:
    """A job's admitted stats files, where the last read stopped, their last readings."""

    names: list[str] = field(default_factory=list)
    after: str = ""
    readings: dict[str, tuple[tuple[int, int], dict[int, StatsSlot]]] = field(
        default_factory=dict)


@dataclass
class SlotsReading:
    slots: dict[int, StatsSlot]
    stale: int
    reads: int


def _slot_seq(data: bytes, index: int) -> int:
    offset = STATS_HEADER_SIZE + index * STATS_SLOT_SIZE + 28
    return int.from_bytes(data[offset:offset + 4], "little")


def read_slots(fd: int, pid: int, tag: int, tries: int,
                previous: dict[int, StatsSlot]) -> SlotsReading | None:
    """Every in-use slot, each read consistently under its seqlock (None: malformed).

    At most ``tries`` reads of the file, and no waiting between them: a slot still odd
    or changing after them is stale (its previous reading stands, if any)."""
    slots: dict[int, StatsSlot] = {}
    pending = list(range(STATS_SLOTS))
    reads = 0
    for _ in range(tries):
        data = os.pread(fd, STATS_SIZE + 1, 0)
        reads += 1
        if len(data) != STATS_SIZE:
            return None
        magic, version, n_slots, file_pid, nccl, file_tag = STATS_HEADER.unpack_from(data)
        if (magic, version, n_slots, file_pid, file_tag) != (
                STATS_MAGIC, STATS_VERSION, STATS_SLOTS, pid, tag):
            return None
        even = [i for i in pending if _slot_seq(data, i) % 2 == 0]
        parsed = {}
        for i in even:
            try:
                parsed[i] = parse_slot(data, STATS_HEADER_SIZE + i * STATS_SLOT_SIZE, pid,
                                       nccl, tag)
            except ValueError:
                return None
        after = os.pread(fd, STATS_SIZE, 0) if even else data
        pending = [i for i in pending if i not in parsed]
        for i, slot in parsed.items():
            if len(after) != STATS_SIZE or _slot_seq(after, i) != _slot_seq(data, i):
                pending.append(i)
            elif slot is not None:
                slots[i] = slot
        if not pending:
            break
    for i in pending:  # a writer kept it odd: stuck mid-update, or hostile
        if i in previous:
            slots[i] = previous[i]
    return SlotsReading(slots, len(pending), reads)


def _alive(fd: int) -> bool:
    """The plugin holds a shared lock for its process's life (inherited by forks)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError as exc:
        return exc.errno in (errno.EWOULDBLOCK, errno.EACCES)
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


class StatsReader:
    """Reads jobs' ``<pid>-<tag>.stats`` files with bounded work per call.

    The files are written by tenant processes, so their number, kind and content are
    untrusted: a malformed file is skipped and counted in ``malformed``; files over
    :class:`StatsLimits`' caps are counted in ``excess`` and ignored; at most
    ``per_read`` files are read per call, round robin across calls (``deferred``: the
    others, whose last readings stand); a slot left mid-update is ``stale``. A file
    whose process died (nobody holds its lock) is not counted and, with
    ``remove_dead``, removed. Totals since the start are kept for operators.
    """

    def __init__(self, directory: str | os.PathLike[str],
                 limits: StatsLimits = StatsLimits()) -> None:
        self.directory = Path(directory)
        self.limits = limits
        self._jobs: dict[str, _Admitted] = {}
        self.totals = {"excess": 0, "stale": 0, "malformed": 0, "deferred": 0, "reads": 0}

    def forget(self, job: str) -> None:
        self._jobs.pop(job, None)

    def keep(self, jobs: set[str]) -> None:
        """Forget what was kept for any other job (it ended)."""
        for job in set(self._jobs) - jobs:
            del self._jobs[job]

    def read(self, job: str, *, remove_dead: bool = True) -> StatsSlots:
        result = StatsSlots()
        try:
            folder = HeldDir.open(job_dir(self.directory, job), owner=os.geteuid())
        except (OSError, ValueError):
            self._jobs.pop(job, None)
            return result
        state = self._jobs.setdefault(job, _Admitted())
        with folder:
            self._admit(folder, state, result)
            names = state.names
            start = next((k for k, name in enumerate(names) if name > state.after), 0)
            turn = (names[start:] + names[:start])[:self.limits.per_read]
            if len(turn) < len(names):
                state.after = turn[-1]
            now_read = set(turn)
            for name in names:
                if name in now_read:
                    self._read_file(folder, state, name, result, remove_dead)
                else:
                    result.deferred += 1
                    readings = state.readings.get(name, (None, {}))[1]
                    result.extend(readings[i] for i in sorted(readings))
        for key in self.totals:
            self.totals[key] += getattr(result, key)
        return result

    def _admit(self, folder: HeldDir, state: _Admitted, result: StatsSlots) -> None:
        """Admitted files still there stay; new ones join in name order within the caps.

        A listing stops at ``4 * per_job`` names (a rank may make millions); admitted
        files it did not reach are looked up by name, so junk cannot push them out."""
        listed, more = folder.names(4 * self.limits.per_job)
        present = {name for name in listed if STATS_NAME.fullmatch(name)}
        if more:
            present.update(name for name in state.names if folder.entry(name) is not None)
        kept = [name for name in state.names if name in present]
        owners: dict[int, int] = {}
        admitted: list[str] = []
        for name in kept + sorted(present.difference(kept)):
            info = folder.entry(name)
            if info is None:
                continue
            if len(admitted) >= self.limits.per_job or \
                    owners.get(info.st_uid, 0) >= self.limits.per_uid:
                result.excess += 1
                continue
            owners[info.st_uid] = owners.get(info.st_uid, 0) + 1
            admitted.append(name)
        result.excess += more
        state.names = sorted(admitted)
        chosen = set(admitted)
        state.readings = {n: r for n, r in state.readings.items() if n in chosen}

    def _read_file(self, folder: HeldDir, state: _Admitted, name: str, result: StatsSlots,
                   remove_dead: bool) -> None:
        match = STATS_NAME.fullmatch(name)
        assert match is not None  # admitted names match
        try:
            fd = folder.open_file(name, os.O_RDONLY, owner=None)
        except Refused:
            result.malformed += 1
            state.readings.pop(name, None)
            return
        except OSError:
            state.readings.pop(name, None)
            return  # gone since the listing (process exited), or not ours to read
        try:
            info = os.fstat(fd)
            identity = (info.st_dev, info.st_ino)
            if not _alive(fd):
                result.dead += 1
                state.readings.pop(name, None)
                if remove_dead:
                    folder.discard(name, identity)
                return
            previous = state.readings.get(name)
            try:
                reading = read_slots(fd, int(match.group(1)), int(match.group(2), 16),
                                      self.limits.seqlock_tries,
                                      previous[1] if previous and previous[0] == identity
                                      else {})
            except OSError:
                reading = None
        finally:
            os.close(fd)
        if reading is None:
            result.malformed += 1
            state.readings.pop(name, None)
            return
        result.reads += reading.reads
        result.stale += reading.stale
        state.readings[name] = (identity, reading.slots)
        result.extend(reading.slots[i] for i in sorted(reading.slots))


def read_stats(directory: str | os.PathLike[str], job: str, *,
               remove_dead: bool = True, limits: StatsLimits = StatsLimits()) -> StatsSlots:
    """Every live slot in the job's stats files, within ``limits`` (one call of a fresh
    :class:`StatsReader`: a loop that reads every pass keeps its own reader)."""
    return StatsReader(directory, limits).read(job, remove_dead=remove_dead)
