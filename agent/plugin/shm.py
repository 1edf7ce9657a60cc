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
import logging
import mmap
import os
import re
import time
from pathlib import Path

from agent.plugin.hostilefs import HeldDir, Refused, prepare_root
from agent.plugin.layout import (
    CHECKSUM_OFFSET,
    POLICY_SIZE,
    SEQ_OFFSET,
    U64_MAX,
    WRITTEN_OFFSET,
    Policy,
    decode_policy,
    encode_policy,
    validate_job,
)
from agent.plugin.statsread import (
    SlotsReading,
    StatsLimits,
    StatsReader,
    job_dir,
    read_slots,
    read_stats,
)

log = logging.getLogger(__name__)

DEFAULT_DIR = Path("/run/harmonaize/tuner")

#: A job's name (as :func:`validate_job` accepts it), for listing the policy directory.
_JOB_NAME = re.compile(r"[A-Za-z0-9._:@+-]{1,128}")


POLICY_NAME = "policy"


LAUNCH_NAME = "nccl.conf"


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


__all__ = ["DEFAULT_DIR", "LAUNCH_NAME", "POLICY_NAME", "PolicyFile", "SlotsReading",
           "StatsLimits", "StatsReader", "job_dir", "job_names", "launch_path", "policy_path",
           "prepare_dirs", "prepare_job_dir", "read_policy", "read_slots", "read_stats",
           "remove_job_dir", "write_launch"]
