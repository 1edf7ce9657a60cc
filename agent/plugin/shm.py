"""The files the agent and the NCCL tuner plugin share (their layouts: :mod:`agent.plugin.layout`).

The agent publishes a *policy* per job in ``<dir>/<job>/policy``. The plugin
(``native/tuner/plugin.c``) maps the file read-only in the tenant's process,
reads it through a seqlock without locks, and accepts a new copy of its entry
only where :func:`~agent.plugin.layout.evaluate` says so. It reports per
communicator what it follows and where it switched in
``<dir>/<job>/<pid>-<tag>.stats``, holding a shared lock on that file for as
long as the process lives. This module does the I/O: directories and their
modes, the policy file written through its seqlock, the stats files read while
their writers live.

A job's directory is writable by every rank of the job, so every file operation
here goes through :mod:`agent.plugin.hostilefs` (no link followed, nothing but
the agent's own regular files written), and the stats files, a tenant's in
number and content, are read with bounded work per call (:class:`StatsReader`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import mmap
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.plugin.hostilefs import HeldDir, Refused, prepare_root
from agent.plugin.layout import (
    CHECKSUM_OFFSET,
    POLICY_SIZE,
    SEQ_OFFSET,
    STATS_HEADER,
    STATS_HEADER_SIZE,
    STATS_MAGIC,
    STATS_NAME,
    STATS_SIZE,
    STATS_SLOT_SIZE,
    STATS_SLOTS,
    STATS_VERSION,
    U64_MAX,
    WRITTEN_OFFSET,
    Policy,
    StatsSlot,
    StatsSlots,
    decode_policy,
    encode_policy,
    parse_slot,
    validate_job,
)

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("/run/harmonaize/tuner")

#: A job's name (as :func:`validate_job` accepts it), for listing the policy directory.
_JOB_NAME = re.compile(r"[A-Za-z0-9._:@+-]{1,128}")


POLICY_NAME = "policy"


LAUNCH_NAME = "nccl.conf"


def job_dir(directory: str | os.PathLike[str], job: str) -> Path:
    return Path(directory) / validate_job(job)


def policy_path(directory: str | os.PathLike[str], job: str) -> Path:
    return job_dir(directory, job) / POLICY_NAME


def launch_path(directory: str | os.PathLike[str], job: str) -> Path:
    return job_dir(directory, job) / LAUNCH_NAME


def prepare_dirs(directory: str | os.PathLike[str]) -> None:
    """The policy directory: root's, and others may pass through but not list it,
    so no process learns which jobs a host runs."""
    prepare_root(directory, mode=0o711)


def prepare_job_dir(directory: str | os.PathLike[str], job: str, gid: int | None) -> Path:
    """A job's directory, reachable only by root and the job's group.

    With a group: ``root:<gid>`` mode 1770. The job's ranks (any uid in the
    group) create their stats files there and give them the directory's
    group (the plugin does; no setgid bit, which a hardened service may not
    set); the sticky bit keeps them from removing or replacing the agent's
    files. Without one: root only (0700); ranks of other users cannot be tuned.
    """
    name = validate_job(job)
    with HeldDir.open(directory, owner=os.geteuid()) as root:
        root.make_subdir(name, mode=0o700 if gid is None else 0o1770,
                         gid=0 if gid is None else gid).close()
    return job_dir(directory, job)


def job_names(directory: str | os.PathLike[str]) -> list[str]:
    """The jobs with a directory in the policy directory (symlinks are not followed)."""
    with HeldDir.open(directory, owner=os.geteuid()) as root:
        return [name for name in root.subdirs() if _JOB_NAME.fullmatch(name)
                and name not in (".", "..")]


def remove_job_dir(directory: str | os.PathLike[str], job: str) -> None:
    """A finished job's directory and everything its ranks left in it."""
    with contextlib.suppress(FileNotFoundError), \
            HeldDir.open(directory, owner=os.geteuid()) as root:
        root.discard_tree(validate_job(job))


def write_launch(directory: str | os.PathLike[str], job: str, text: str) -> None:
    """The job's next-launch NCCL file, readable by the job's group: created anew under a
    name nobody can have planted and renamed over ``nccl.conf``."""
    with HeldDir.open(job_dir(directory, job), owner=os.geteuid()) as folder:
        folder.create(LAUNCH_NAME, text.encode(), mode=0o640)


class PolicyFile:
    """The agent's writable handle on ``<dir>/<job>/policy``.

    The file is created whole (written to a temporary name, then renamed), so
    the plugin never maps a short file; afterwards it is only ever rewritten
    in place under the seqlock, never truncated, so live mappings stay valid.
    An existing file is kept as it is: ranks follow what is in it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        with HeldDir.open(self.path.parent, owner=os.geteuid()) as folder:
            fd = self._open(folder)
        try:
            info = os.fstat(fd)
            self.identity = (info.st_dev, info.st_ino)
            self._map = mmap.mmap(fd, POLICY_SIZE, mmap.MAP_SHARED,
                                  mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        # 8-byte views: assigning an item is one aligned 8-byte store, so the
        # plugin's atomic load of seq never sees a torn value (struct.pack_into
        # stores little-endian integers byte by byte).
        self._words = memoryview(self._map).cast("Q")

    def _open(self, folder: HeldDir) -> int:
        """The agent's own policy file, made if missing. Anything else at the name (a
        rank's file, link, FIFO, device node) is replaced by a new file: the rename
        replaces the entry, not what it points at."""
        name = self.path.name
        with contextlib.suppress(FileNotFoundError):
            try:
                fd = folder.open_file(name, os.O_RDWR, owner=os.geteuid())
            except Refused as exc:
                log.warning("%s: %s; replaced by a new policy file", folder.label, exc)
            else:
                if os.fstat(fd).st_size == POLICY_SIZE:
                    return fd  # rewritten in place by write(): live mappings follow it
                os.close(fd)
        # An empty policy lists nothing: NCCL's own choices until the first write().
        folder.create(name, encode_policy(Policy(0)), mode=0o640)
        return folder.open_file(name, os.O_RDWR, owner=os.geteuid())

    @property
    def seq(self) -> int:
        return self._words[SEQ_OFFSET // 8]

    def write(self, policy: Policy) -> None:
        """Publish ``policy`` under the seqlock.

        Order: seq made odd, body, checksum, seq made even. Each step is a
        store the interpreter performs in program order, and x86-64 keeps
        stores in order (TSO), so a reader that sees the even seq sees the
        whole body. A weakly ordered CPU (arm64, POWER) would need a store
        fence after the odd seq and before the even seq (e.g. a release
        store through a small C helper), which Python cannot issue.
        """
        image = encode_policy(policy)
        seq = self.seq
        odd = seq + 1 if seq % 2 == 0 else seq + 2  # a dead writer may have left it odd
        self._words[SEQ_OFFSET // 8] = odd & U64_MAX
        self._map[0:SEQ_OFFSET] = image[0:SEQ_OFFSET]
        self._map[24:CHECKSUM_OFFSET] = image[24:CHECKSUM_OFFSET]
        self._map[CHECKSUM_OFFSET + 4:POLICY_SIZE] = image[CHECKSUM_OFFSET + 4:POLICY_SIZE]
        self._map[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 4] = image[CHECKSUM_OFFSET:CHECKSUM_OFFSET + 4]
        self._words[SEQ_OFFSET // 8] = (odd + 1) & U64_MAX
        self._words[WRITTEN_OFFSET // 8] = time.monotonic_ns()

    def close(self) -> None:
        if not self._map.closed:
            self._words.release()
            self._map.close()

    def remove(self) -> None:
        """Withdraw the file: plugins keep their mapping of the unlinked file and
        the entry they hold, so nothing switches."""
        self.close()
        with contextlib.suppress(FileNotFoundError), \
                HeldDir.open(self.path.parent, owner=os.geteuid()) as folder:
            folder.discard(self.path.name, self.identity)

    def __enter__(self) -> PolicyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_policy(path: str | os.PathLike[str], attempts: int = 100) -> Policy:
    """Read and validate a policy file as the plugin would (ValueError if it
    would not use it). Reads with pread, not mmap: a short file cannot fault."""
    path = Path(path)
    with HeldDir.open(path.parent, owner=os.geteuid()) as folder:
        fd = folder.open_file(path.name, os.O_RDONLY, owner=os.geteuid())
    try:
        for _ in range(attempts):
            before = os.pread(fd, 8, SEQ_OFFSET)
            image = os.pread(fd, POLICY_SIZE, 0)
            after = os.pread(fd, 8, SEQ_OFFSET)
            if len(image) < POLICY_SIZE:
                raise ValueError(f"policy file is {len(image)} bytes, needs {POLICY_SIZE}")
            if before == after and int.from_bytes(before, "little") % 2 == 0:
                return decode_policy(image)
            time.sleep(0.001)
    finally:
        os.close(fd)
    raise ValueError("policy file is being rewritten (seq odd or changing)")


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
