"""Files in directories a tenant's process can write, handled as hostile.

A job's directory under the policy directory is ``root:<job group>`` 1770: every rank
of the job can create any name in it. Whatever name the agent uses there may already be
a symlink (to a root-only file elsewhere), a hard link to a file outside, a FIFO (an
open would block), a device node, a directory, or a file of another owner. This module
is the only agent code that opens, creates, renames, changes, stats, lists or removes
anything under the policy directory
(``tests/agent/plugin/test_only_hostilefs_touches_job_directories.py`` scans the agent
for any other), and it does all of it through a descriptor of the directory:

- a directory is opened with ``O_DIRECTORY | O_NOFOLLOW`` and checked (a directory of
  the expected owner); every name is then looked up relative to that descriptor
  (``dir_fd=``), in that directory and nowhere else;
- a file is first opened ``O_PATH | O_NOFOLLOW`` (no FIFO waits, no device is opened, a
  symlink is the link itself) and refused after ``fstat`` unless it is a regular file with
  one link (not a hard link to a file elsewhere) of the expected owner; only that inode is
  then opened for I/O (``O_NONBLOCK | O_NOCTTY``), through its descriptor;
- a file the agent makes is created under a fresh random name with ``O_CREAT | O_EXCL``
  (an existing name, a symlink included, fails and another is drawn), its mode and group
  set with ``fchmod``/``fchown`` on its descriptor, and renamed within the held directory
  (a rename replaces the entry at the name itself, never what a symlink there points at).

Refusals are :class:`Refused` (a ``ValueError``) with one line that says what was found.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

#: Flags every open of a file here carries (a symlink fails; a FIFO or device never blocks).
FILE_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

#: Flags of the second open of a checked file through its descriptor's /proc link.
REOPEN_FLAGS = os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

#: Flags every open of a directory here carries.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: Fresh temporary names drawn before giving up (a collision of 64 random bits is planted).
TEMPORARY_DRAWS = 8


class Refused(ValueError):
    """An entry the agent will not use: one line saying what it is."""


def describe(mode: int) -> str:
    """What kind of entry a mode is, for a refusal's line."""
    kinds = ((stat.S_ISLNK, "a symlink"), (stat.S_ISDIR, "a directory"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a device node"),
             (stat.S_ISBLK, "a device node"), (stat.S_ISSOCK, "a socket"))
    return next((text for test, text in kinds if test(mode)), "a regular file")


def check_regular(name: str, info: os.stat_result, owner: int | None) -> None:
    """Raise :class:`Refused` unless ``info`` is a regular file with one link (and of
    ``owner``, when given)."""
    if not stat.S_ISREG(info.st_mode):
        raise Refused(f"{name} is {describe(info.st_mode)}: refused")
    if info.st_nlink != 1:
        raise Refused(f"{name} has {info.st_nlink} links (a hard link to a file elsewhere): "
                      "refused")
    if owner is not None and info.st_uid != owner:
        raise Refused(f"{name} belongs to uid {info.st_uid}, not {owner}: refused")


class HeldDir:
    """A directory held by an ``O_NOFOLLOW`` descriptor; names resolve inside it only."""

    def __init__(self, fd: int, label: str) -> None:
        self.fd = fd
        self.label = label

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, owner: int | None = None) -> HeldDir:
        """``path`` as a directory (its last component not a symlink) of ``owner``."""
        try:
            fd = os.open(path, DIR_FLAGS)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(f"{path} is not a directory (a symlink or a file): refused") \
                    from None
            raise
        return cls._checked(fd, str(path), owner)

    @classmethod
    def _checked(cls, fd: int, label: str, owner: int | None) -> HeldDir:
        info = os.fstat(fd)
        if owner is not None and info.st_uid != owner:
            os.close(fd)
            raise Refused(f"{label} belongs to uid {info.st_uid}, not {owner}: refused")
        return cls(fd, label)

    def subdir(self, name: str, *, owner: int | None = None) -> HeldDir:
        """The directory ``name`` in this one (not a symlink), of ``owner``."""
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise Refused(f"{self.label}/{name} is not a directory: refused") from None
            raise
        return self._checked(fd, f"{self.label}/{name}", owner)

    def make_subdir(self, name: str, *, mode: int, gid: int) -> HeldDir:
        """``name`` made (or found) as a directory of the agent's, then given ``mode`` and
        ``root:gid`` (as root) on its descriptor."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=self.fd)
        held = self.subdir(name, owner=os.geteuid())
        try:
            if os.geteuid() == 0:
                os.fchown(held.fd, 0, gid)
            os.fchmod(held.fd, mode)
        except BaseException:
            held.close()
            raise
        return held

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> HeldDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def gid(self) -> int:
        return os.fstat(self.fd).st_gid

    def prepare(self, *, mode: int) -> None:
        """Owner root (as root) and ``mode`` for the held directory itself."""
        if os.geteuid() == 0:
            os.fchown(self.fd, 0, 0)
        os.fchmod(self.fd, mode)

    def names(self, limit: int) -> tuple[list[str], int]:
        """Up to ``limit`` names in the directory and how many more there were (a tenant
        may make millions: listing stops counting at ``2 * limit``)."""
        found: list[str] = []
        more = 0
        with os.scandir(self.fd) as entries:
            for entry in entries:
                if len(found) < limit:
                    found.append(entry.name)
                    continue
                more += 1
                if more >= limit:
                    break
        return found, more

    def subdirs(self) -> Iterator[str]:
        """Names of the directories in the held one (symlinks are not followed)."""
        with os.scandir(self.fd) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    yield entry.name

    def entry(self, name: str) -> os.stat_result | None:
        """The entry itself (never what it points at); None where there is none."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def open_file(self, name: str, flags: int, *, owner: int | None) -> int:
        """A descriptor of the regular file ``name`` with one link (of ``owner``, when
        given). Raises :class:`Refused` for anything else, FileNotFoundError if absent.

        The entry is first opened ``O_PATH | O_NOFOLLOW`` (which opens nothing: no FIFO
        waits, no device's open runs, a symlink is the link itself) and checked; only the
        checked inode is then opened for I/O, through its ``/proc/self/fd`` link, so a
        name swapped in between is never what gets opened."""
        handle = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        try:
            info = os.fstat(handle)
            check_regular(name, info, owner)
            fd = os.open(f"/proc/self/fd/{handle}", flags | REOPEN_FLAGS)
        finally:
            os.close(handle)
        return fd

    def create(self, name: str, data: bytes, *, mode: int) -> tuple[int, int]:
        """``data`` written to a new file of the agent's, renamed to ``name``; the file
        gets ``mode`` and the directory's group (as root). Returns its (device, inode)."""
        fd, temporary = self._new_temporary(name)
        try:
            os.fchmod(fd, mode)
            if os.geteuid() == 0:
                os.fchown(fd, 0, self.gid)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            info = os.fstat(fd)
            try:
                os.rename(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
            except IsADirectoryError:  # a file renamed over a directory: EISDIR
                raise Refused(f"{name} is a directory: refused") from None
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary, dir_fd=self.fd)
            raise
        finally:
            os.close(fd)
        return info.st_dev, info.st_ino

    def _new_temporary(self, name: str) -> tuple[int, str]:
        for _ in range(TEMPORARY_DRAWS):
            temporary = f".{name}.{secrets.token_hex(8)}.tmp"
            try:
                fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | FILE_FLAGS,
                             0o600, dir_fd=self.fd)
            except FileExistsError:
                continue
            return fd, temporary
        raise Refused(f"no free temporary name for {name} in {self.label}: refused")

    def discard(self, name: str, identity: tuple[int, int] | None = None) -> bool:
        """Unlink the entry ``name`` (a link, never its target); with ``identity``, only
        while it is still that file. A directory is not removed. True if removed."""
        info = self.entry(name)
        if info is None or stat.S_ISDIR(info.st_mode):
            return False
        if identity is not None and (info.st_dev, info.st_ino) != identity:
            return False
        try:
            os.unlink(name, dir_fd=self.fd)
        except FileNotFoundError:
            return False
        return True

    def discard_tree(self, name: str) -> None:
        """Remove the directory ``name`` and all in it. shutil.rmtree opens each level
        with O_NOFOLLOW relative to its parent's descriptor (it never follows a link a
        tenant made); a tree nested too deep for it is left and said so."""
        try:
            shutil.rmtree(name, dir_fd=self.fd)
        except FileNotFoundError:
            return
        except RecursionError:
            raise Refused(f"{self.label}/{name} is nested too deeply to remove: left") from None


def prepare_root(path: str | os.PathLike[str], *, mode: int) -> None:
    """The policy directory itself: made if missing, root's (as root), ``mode``."""
    Path(path).mkdir(parents=True, exist_ok=True)
    with HeldDir.open(path, owner=os.geteuid()) as held:
        held.prepare(mode=mode)
