"""hostilefs's own promises, one by one: exact refusals, fresh whole files, no link followed."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from agent.plugin.hostilefs import HeldDir, Refused, describe
from agent.plugin.shm import job_dir, prepare_dirs, prepare_job_dir
from tests.agent.plugin.test_hostile_files import JOB, NOBODY
from tests.conftest import needs_root

pytestmark = [pytest.mark.hardening, needs_root]


# ---- The module's own promises, one by one (its mutation score rests on these). ----


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def refusal(call, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(Refused) as caught:
        call(*args, **kwargs)
    return str(caught.value)


def test_item1_each_refusal_is_one_exact_line_and_leaks_no_descriptor(workdir: Path) -> None:
    import socket  # noqa: PLC0415

    assert describe(stat.S_IFREG | 0o644) == "a regular file"

    (workdir / "target").write_bytes(b"x")
    (workdir / "link").symlink_to(workdir / "target")
    os.mkfifo(workdir / "fifo")
    os.mknod(workdir / "chr", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(workdir / "blk", 0o600 | stat.S_IFBLK, os.makedev(7, 0))
    os.link(workdir / "target", workdir / "hard")
    (workdir / "dir").mkdir()
    (workdir / "theirs").write_bytes(b"t")
    os.chown(workdir / "theirs", NOBODY, NOBODY)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(workdir / "sock"))
    try:
        before = open_descriptors()
        with HeldDir.open(workdir, owner=0) as held:
            said = {name: refusal(held.open_file, name, os.O_RDONLY, owner=0)
                    for name in ("link", "fifo", "chr", "blk", "hard", "dir", "sock", "theirs")}
            assert said == {
                "link": "link is a symlink: refused", "fifo": "fifo is a FIFO: refused",
                "chr": "chr is a device node: refused", "blk": "blk is a device node: refused",
                "hard": "hard has 2 links (a hard link to a file elsewhere): refused",
                "dir": "dir is a directory: refused", "sock": "sock is a socket: refused",
                "theirs": f"theirs belongs to uid {NOBODY}, not 0: refused"}
            assert refusal(held.subdir, "link") == f"{workdir}/link is not a directory: refused"
            assert refusal(held.subdir, "target") == \
                f"{workdir}/target is not a directory: refused"
            assert refusal(held.subdir, "dir", owner=NOBODY) == \
                f"{workdir}/dir belongs to uid 0, not {NOBODY}: refused"
        assert refusal(HeldDir.open, workdir / "link") == \
            f"{workdir / 'link'} is not a directory (a symlink or a file): refused"
        assert refusal(HeldDir.open, workdir / "target") == \
            f"{workdir / 'target'} is not a directory (a symlink or a file): refused"
        assert refusal(HeldDir.open, workdir, owner=NOBODY) == \
            f"{workdir} belongs to uid 0, not {NOBODY}: refused"
        with pytest.raises(FileNotFoundError):
            HeldDir.open(workdir / "absent")
        with HeldDir.open(workdir) as held, pytest.raises(FileNotFoundError):
            held.subdir("absent")
        assert open_descriptors() == before
    finally:
        server.close()


def test_item1_files_are_made_whole_under_fresh_names_with_the_directorys_group(
        workdir: Path) -> None:
    folder = workdir / "job"
    folder.mkdir()
    os.chown(folder, 0, NOBODY)
    before = open_descriptors()
    with HeldDir.open(folder, owner=0) as held:
        assert held.gid == NOBODY
        data = b"x" * 300_000  # more than one write may take
        identity = held.create("made", data, mode=0o640)
        info = (folder / "made").lstat()
        assert (info.st_dev, info.st_ino) == identity
        assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, NOBODY, 0o640)
        assert (folder / "made").read_bytes() == data
        held.create("made", b"again", mode=0o600)  # replaced whole, by rename
        assert (folder / "made").read_bytes() == b"again"
        assert stat.S_IMODE((folder / "made").stat().st_mode) == 0o600
        fd = held.open_file("made", os.O_RDWR, owner=0)
        os.pwrite(fd, b"A", 0)
        os.close(fd)
        assert (folder / "made").read_bytes() == b"Again"
        (folder / "taken").mkdir()
        (folder / "taken" / "inside").write_bytes(b"")
        assert refusal(held.create, "taken", b"x", mode=0o640) == "taken is a directory: refused"
        assert sorted(p.name for p in folder.iterdir()) == ["made", "taken"]  # no temporary left
    assert open_descriptors() == before


def test_item1_temporary_names_are_drawn_afresh_and_never_reused(
        workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted temporary name (even one drawn) makes the next draw, never an open of it."""
    from agent.plugin import hostilefs  # noqa: PLC0415

    draws = iter(["aaaa", "bbbb"] + ["cccc"] * 20)
    monkeypatch.setattr(hostilefs.secrets, "token_hex", lambda n: next(draws))
    secret = workdir / "secret"
    secret.write_bytes(b"root only\n")
    (workdir / ".made.aaaa.tmp").symlink_to(secret)
    with HeldDir.open(workdir) as held:
        held.create("made", b"mine", mode=0o640)
        assert (workdir / "made").read_bytes() == b"mine"
        assert secret.read_bytes() == b"root only\n"
        (workdir / ".made.cccc.tmp").write_bytes(b"planted")
        assert refusal(held.create, "made", b"x", mode=0o640) == \
            f"no free temporary name for made in {workdir}: refused"
        assert len(list(draws)) == 20 - hostilefs.TEMPORARY_DRAWS  # each drawn once
    assert (workdir / ".made.cccc.tmp").read_bytes() == b"planted"


def test_item1_listing_and_removal_never_follow_a_link(workdir: Path) -> None:
    outside = workdir / "outside"
    outside.mkdir()
    (outside / "keep").write_bytes(b"k")
    folder = workdir / "job"
    folder.mkdir()
    for k in range(10):
        (folder / f"f{k}").write_bytes(b"")
    (folder / "sub").mkdir()
    (folder / "tolink").symlink_to(outside)
    with HeldDir.open(folder) as held:
        names, more = held.names(5)
        assert len(names) == 5 and more == 5  # counting stops at the limit
        names, more = held.names(8)
        assert len(names) == 8 and more == 4
        names, more = held.names(100)
        assert sorted(names) == sorted([f"f{k}" for k in range(10)] + ["sub", "tolink"])
        assert more == 0
        assert list(held.subdirs()) == ["sub"]  # the symlink to a directory is not one
        assert held.entry("absent") is None
        assert stat.S_ISLNK(held.entry("tolink").st_mode)
        info = held.entry("f0")
        assert held.discard("f0", (info.st_dev, info.st_ino))
        assert not held.discard("f0")  # gone
        assert not held.discard("sub")  # a directory is not unlinked
        assert held.discard("tolink") and (outside / "keep").exists()
        (folder / "sub" / "link").symlink_to(outside)
        held.discard_tree("sub")
        held.discard_tree("sub")  # already gone: nothing to say
        assert (outside / "keep").read_bytes() == b"k"
        assert held.entry("sub") is None


def test_item1_a_tree_too_deep_to_remove_is_left_in_one_line(workdir: Path) -> None:
    import inspect  # noqa: PLC0415

    folder = workdir / "job"
    folder.mkdir()
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(200):
        os.mkdir("d", dir_fd=fd)
        deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = deeper
    os.close(fd)
    limit = sys.getrecursionlimit()
    with HeldDir.open(workdir) as held:
        sys.setrecursionlimit(len(inspect.stack()) + 60)
        try:
            said = refusal(held.discard_tree, "job")
        finally:
            sys.setrecursionlimit(limit)
    assert said == f"{workdir}/job is nested too deeply to remove: left"


def test_item1_directories_are_prepared_on_their_descriptor(workdir: Path) -> None:
    root = workdir / "run" / "tuner"  # its parent made too
    prepare_dirs(root)
    os.chown(root, 0, NOBODY)
    root.chmod(0o777)
    prepare_dirs(root)  # found, and made root's again
    info = root.stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o711)
    prepare_job_dir(root, JOB, NOBODY)
    info = job_dir(root, JOB).stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, NOBODY, 0o1770)
    prepare_job_dir(root, JOB, None)  # found, then made root's alone
    info = job_dir(root, JOB).stat()
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (0, 0, 0o700)
    (root / "theirs").mkdir()
    os.chown(root / "theirs", NOBODY, NOBODY)
    assert refusal(prepare_job_dir, root, "theirs", NOBODY) == \
        f"{root}/theirs belongs to uid {NOBODY}, not 0: refused"
    os.chown(root, NOBODY, NOBODY)
    assert refusal(prepare_dirs, root) == f"{root} belongs to uid {NOBODY}, not 0: refused"
    os.chown(root, 0, 0)
    (root / "planted").symlink_to(workdir)
    with pytest.raises(Refused):
        prepare_job_dir(root, "planted", NOBODY)
    assert stat.S_IMODE(workdir.stat().st_mode) == 0o755  # the link's target is untouched
    held = HeldDir.open(root)
    held.close()
    held.close()  # twice: nothing else is closed
    assert held.fd == -1
