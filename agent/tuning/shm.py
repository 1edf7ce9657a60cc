"""The files the agent and the NCCL tuner plugin share (their layouts: :mod:`agent.tuning.layout`).

The agent publishes a *policy* per job in ``<dir>/<job>/policy``. The plugin
(``native/tuner/plugin.c``) maps the file read-only in the tenant's process,
reads it through a seqlock without locks, and accepts a new copy of its entry
only where :func:`~agent.tuning.layout.evaluate` says so. It reports per
communicator what it follows and where it switched in
``<dir>/<job>/<pid>-<tag>.stats``, holding a shared lock on that file for as
long as the process lives. This module does the I/O: directories and their
modes, the policy file written through its seqlock, the stats files read while
their writers live.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import stat
import time
from pathlib import Path

from agent.tuning.layout import (
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

DEFAULT_DIR = Path("/run/harmonaize/tuner")


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
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, 0, 0)
    path.chmod(0o711)


def prepare_job_dir(directory: str | os.PathLike[str], job: str, gid: int | None) -> Path:
    """A job's directory, reachable only by root and the job's group.

    With a group: ``root:<gid>`` mode 1770. The job's ranks (any uid in the
    group) create their stats files there and give them the directory's
    group (the plugin does; no setgid bit, which a hardened service may not
    set); the sticky bit keeps them from removing or replacing the agent's
    files. Without one: root only (0700); ranks of other users cannot be tuned.
    """
    path = job_dir(directory, job)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        info = path.lstat()
        if not stat.S_ISDIR(info.st_mode):
            raise ValueError(f"{path} exists and is not a directory") from None
    if os.geteuid() == 0:
        os.chown(path, 0, 0 if gid is None else gid)
    path.chmod(0o700 if gid is None else 0o1770)
    return path


def _fchown_group(fd: int, path: Path) -> None:
    """Give a file the group of its directory (the job's), for the ranks to read."""
    if os.geteuid() == 0:
        os.fchown(fd, 0, path.parent.stat().st_gid)


class PolicyFile:
    """The agent's writable handle on ``<dir>/<job>/policy``.

    The file is created whole (written to a temporary name, then renamed), so
    the plugin never maps a short file; afterwards it is only ever rewritten
    in place under the seqlock, never truncated, so live mappings stay valid.
    An existing file is kept as it is: ranks follow what is in it.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._ensure_file()
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
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

    def _ensure_file(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            info = self.path.lstat()
            if stat.S_ISREG(info.st_mode) and info.st_size == POLICY_SIZE:
                return  # rewritten in place by write(): live mappings follow it
        # An empty policy lists nothing: NCCL's own choices until the first write().
        tmp = self.path.parent / f".{self.path.name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
        try:
            os.fchmod(fd, 0o640)
            _fchown_group(fd, self.path)
            os.write(fd, encode_policy(Policy(0)))
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)

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
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> PolicyFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_policy(path: str | os.PathLike[str], attempts: int = 100) -> Policy:
    """Read and validate a policy file as the plugin would (ValueError if it
    would not use it). Reads with pread, not mmap: a short file cannot fault."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
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


def _read_slots(fd: int, pid: int, tag: int, attempts: int = 50) -> list[StatsSlot] | None:
    """Every in-use slot, each read consistently under its seqlock (None: malformed)."""
    slots: dict[int, StatsSlot] = {}
    pending = list(range(STATS_SLOTS))
    nccl = 0
    for _ in range(attempts):
        data = os.pread(fd, STATS_SIZE + 1, 0)
        if len(data) != STATS_SIZE:
            return None
        magic, version, n_slots, file_pid, nccl, file_tag = STATS_HEADER.unpack_from(data)
        if (magic, version, n_slots, file_pid, file_tag) != (
                STATS_MAGIC, STATS_VERSION, STATS_SLOTS, pid, tag):
            return None
        again = []
        for i in pending:
            offset = STATS_HEADER_SIZE + i * STATS_SLOT_SIZE
            seq = int.from_bytes(data[offset + 28:offset + 32], "little")
            if seq % 2:
                again.append(i)
                continue
            try:
                slot = parse_slot(data, offset, pid, nccl, tag)
            except ValueError:
                return None
            after = os.pread(fd, 4, offset + 28)
            if int.from_bytes(after, "little") != seq:
                again.append(i)
            elif slot is not None:
                slots[i] = slot
        pending = again
        if not pending:
            return [slots[i] for i in sorted(slots)]
        time.sleep(0.0002)
    return None  # a writer kept a slot odd: the process is stuck mid-update, or hostile


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


def read_stats(directory: str | os.PathLike[str], job: str, *,
               remove_dead: bool = True) -> StatsSlots:
    """Every live slot in the job's ``<pid>-<tag>.stats`` files.

    The files are written by tenant processes, so their content is untrusted:
    a malformed file is skipped and counted in ``malformed``, never raised.
    A file whose process died (nobody holds its lock) is not counted and, with
    ``remove_dead``, removed.
    """
    folder = job_dir(directory, job)
    result = StatsSlots()
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return result
    for name in names:
        match = STATS_NAME.fullmatch(name)
        if match is None:
            continue
        path = folder / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue  # gone since the listing (process exited), or not ours to read
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                result.malformed += 1
                continue
            if not _alive(fd):
                result.dead += 1
                if remove_dead:
                    with contextlib.suppress(OSError):
                        path.unlink()
                continue
            try:
                slots = _read_slots(fd, int(match.group(1)), int(match.group(2), 16))
            except OSError:
                slots = None
        finally:
            os.close(fd)
        if slots is None:
            result.malformed += 1
        else:
            result.extend(slots)
    return result
