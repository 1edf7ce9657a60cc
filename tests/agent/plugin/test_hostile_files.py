"""Issue 28, item 1: files in a job's directory (writable by the job's ranks) are hostile.

A rank of the job's group planted the agent's fixed temporary name as a symlink to a
root-only file, and the agent overwrote that file and made it readable to the rank. Here a
real unprivileged process (``nobody``, in the job's group) plants symlinks, FIFOs,
directories and files of its own at every name the agent uses in the job's directory
(the final names, the old predictable temporary names, a stats file's name); root plants
what a rank cannot (hard links to a file outside, a device node). The real agent code then
runs through a job's life (adoption, stats reads, the next-launch file, the policy file,
the energy loop's read, cleanup), and nothing outside is opened, read, written or changed
(watched with inotify on the files themselves, and their content, mode, owner and mtime),
no planted file of the rank's is written, and the agent keeps serving with one-line
warnings. An architecture test checks that no other agent code touches those paths.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.links.settings import LinksSection
from agent.plugin.hostilefs import HeldDir, Refused
from agent.plugin.layout import POLICY_SIZE, Policy, encode_policy
from agent.plugin.shm import prepare_dirs, prepare_job_dir, read_stats
from agent.tuning.loop import WritePolicy
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from harmonaize.messages import Algorithm, Collective, JobDeclaration, Protocol, TuningRange
from testbed.tuningsim import link_judgements, link_sample
from tests.conftest import needs_root

pytestmark = [pytest.mark.hardening, needs_root]

ROOT = Path(__file__).resolve().parents[3]
NOBODY = 65534
JOB = "train-hostile"
DECLARATION = JobDeclaration(JOB, revision=1, group=str(NOBODY), tuning=(TuningRange(
    (Collective.ALLREDUCE,), (Algorithm.RING, Algorithm.TREE), (Protocol.LL, Protocol.SIMPLE),
    0, 1 << 40, 2, 16),))

#: Every name the agent uses in a job's directory, and the temporary names it once used.
NAMES = ("policy", "nccl.conf", ".nccl.conf.tmp", f".policy.{os.getpid()}.tmp",
         "4242-00000000000000ab.stats")
#: What a rank can plant itself (as nobody) ...
RANK_KINDS = ("symlink", "fifo", "directory", "own_file")
#: ... and what only root can (a hard link to a root-only file is refused to a rank by
#: fs.protected_hardlinks; a device node needs CAP_MKNOD): planted to be sure anyway.
ROOT_KINDS = ("hardlink", "device")

PLANT = """
import json, os, sys
for path, kind, target in json.loads(sys.argv[1]):
    if kind == "symlink":
        os.symlink(target, path)
    elif kind == "fifo":
        os.mkfifo(path, 0o666)
    elif kind == "directory":
        os.mkdir(path, 0o777)
        with open(os.path.join(path, "inside"), "wb") as out:
            out.write(b"a rank's")
    elif kind == "own_file":
        with open(path, "wb") as out:
            out.write(bytes.fromhex(sys.argv[2]))
"""


def plant(folder: Path, plantings: list[tuple[str, str]], secret: Path, linked: Path) -> None:
    as_rank = [(str(folder / name), kind, str(secret)) for name, kind in plantings
               if kind in RANK_KINDS]
    if as_rank:
        subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                        "--clear-groups", sys.executable, "-c", PLANT, json.dumps(as_rank),
                        encode_policy(Policy(0)).hex()], check=True, timeout=60)
    for name, kind in plantings:
        if kind == "hardlink":
            os.link(linked, folder / name)
        elif kind == "device":  # /dev/null's numbers
            os.mknod(folder / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


class Inotify:
    """Opens, reads and writes of the watched files, whichever link they come through
    (the watch is on the inode)."""

    EVENTS = 0x1 | 0x2 | 0x20  # IN_ACCESS | IN_MODIFY | IN_OPEN

    def __init__(self, paths: list[Path]) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        assert self.fd >= 0
        for path in paths:
            assert self.libc.inotify_add_watch(self.fd, str(path).encode(), self.EVENTS) >= 0

    def events(self) -> list[int]:
        masks: list[int] = []
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self.fd, 65536):
                offset = 0
                while offset < len(data):
                    _, mask, _, length = struct.unpack_from("iIII", data, offset)
                    masks.append(mask)
                    offset += 16 + length
        return masks

    def close(self) -> None:
        os.close(self.fd)


def look(path: Path) -> tuple[str, int, int, int, int]:
    info = path.stat()
    return (hashlib.sha256(path.read_bytes()).hexdigest(), info.st_mode, info.st_uid,
            info.st_gid, info.st_mtime_ns)


class OneLineWarnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def watchdog(seconds: int) -> Iterator[None]:
    """A FIFO the agent waited on would hang the test: fail it instead."""
    def expired(*_: object) -> None:
        raise AssertionError("the agent blocked (a FIFO opened without O_NONBLOCK?)")
    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def a_jobs_life(directory: Path) -> TuningService:
    """The agent's real code paths over the job's directory, start to cleanup."""
    service = TuningService(TuningSection(policy_dir=str(directory), htb=False, orphan_grace=0),
                            LinksSection(), publish=lambda message: None)
    service.start(0.0)  # the directory is found, an orphan until declared
    service.declare(DECLARATION, 0.0)  # the directory prepared, the previous policy adopted
    for now in (1.0, 2.0):  # stats read, the next-launch file written
        service.step(link_sample(0), link_judgements(0), now)
    service._run([WritePolicy(JOB, ())], 3.0)  # the policy file, as the loop asks for it
    read_stats(directory, JOB, remove_dead=False)  # as the energy loop reads them
    service.withdraw(JOB, 4.0)  # settled: its files removed
    service.step(link_sample(0), link_judgements(0), 5.0)
    return service


def every_single_planting(test):  # type: ignore[no-untyped-def]
    for name in NAMES:
        for kind in RANK_KINDS + ROOT_KINDS:
            test = example(plantings=[(name, kind)])(test)
    return test


@settings(derandomize=True, max_examples=15, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@every_single_planting
@given(plantings=st.lists(st.tuples(st.sampled_from(NAMES),
                                    st.sampled_from(RANK_KINDS + ROOT_KINDS)),
                          min_size=2, max_size=len(NAMES), unique_by=lambda p: p[0]))
def test_item1_planted_links_fifos_devices_and_files_never_let_the_agent_touch_outside(
        plantings: list[tuple[str, str]]) -> None:
    work = Path(tempfile.mkdtemp(prefix="hz-hostile-"))
    work.chmod(0o755)
    handler = OneLineWarnings()
    logging.getLogger("agent").addHandler(handler)
    held: dict[str, int] = {}
    watch = None
    try:
        outside = work / "outside"
        outside.mkdir(mode=0o700)
        secret, linked = outside / "secret", outside / "linked"
        for path in (secret, linked):
            path.write_bytes(b"root only\n")
            path.chmod(0o600)
        directory = work / "tuner"
        prepare_dirs(directory)
        folder = prepare_job_dir(directory, JOB, NOBODY)  # as a previous agent left it
        plant(folder, plantings, secret, linked)
        for name, kind in plantings:  # the rank's own files and FIFOs, held to look at later
            if kind in ("own_file", "fifo"):
                held[name] = os.open(folder / name, os.O_RDONLY | os.O_NONBLOCK)
        own = {name: os.pread(fd, 1 << 16, 0) for name, fd in held.items()
               if dict(plantings)[name] == "own_file"}
        before = {path: look(path) for path in (secret, linked)}
        watch = Inotify([secret, linked])

        with watchdog(60):
            service = a_jobs_life(directory)  # nothing escapes: it keeps serving

        assert watch.events() == [], "a file outside was opened, read or written"
        assert {path: look(path) for path in (secret, linked)} == before
        for name, fd in held.items():
            if name in own:  # the rank's file was not written by the agent
                assert os.pread(fd, 1 << 16, 0) == own[name]
                assert os.fstat(fd).st_uid == NOBODY
            else:  # nothing was written into the FIFO
                with contextlib.suppress(BlockingIOError):
                    assert os.read(fd, 1 << 16) == b""
        assert not folder.exists(), "the job's directory outlived the job"
        assert service.jobs_view(6.0)["jobs"] == []
        for record in handler.records:
            assert record.exc_info is None and "\n" not in record.getMessage(), record
    finally:
        logging.getLogger("agent").removeHandler(handler)
        for fd in held.values():
            os.close(fd)
        if watch is not None:
            watch.close()
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.parametrize("kind", RANK_KINDS + ROOT_KINDS)
@pytest.mark.parametrize("name", ["policy", "nccl.conf"])
def test_item1_the_agents_own_files_replace_whatever_a_rank_planted(
        workdir: Path, name: str, kind: str) -> None:
    """Where the agent can write, its file at the final name is its own: root's, a
    regular file with one link, group-readable by the job only; a directory planted there
    stops that file alone, in one line, and the agent goes on."""
    secret, linked = workdir / "secret", workdir / "linked"
    for path in (secret, linked):
        path.write_bytes(b"root only\n")
        path.chmod(0o600)
    directory = workdir / "tuner"
    prepare_dirs(directory)
    folder = prepare_job_dir(directory, JOB, NOBODY)
    plant(folder, [(name, kind)], secret, linked)
    service = TuningService(TuningSection(policy_dir=str(directory), htb=False),
                            LinksSection(), publish=lambda message: None)
    service.start(0.0)
    service.declare(DECLARATION, 0.0)
    service.step(link_sample(0), link_judgements(0), 1.0)
    written = service._write(WritePolicy(JOB, ()))
    info = (folder / name).lstat()
    if kind == "directory":
        assert stat.S_ISDIR(info.st_mode)
        assert f"{name} is a directory: refused" in service.last_error
        assert "\n" not in service.last_error
        assert written == (name != "policy")
    else:
        assert written
        assert stat.S_ISREG(info.st_mode) and info.st_nlink == 1
        assert (info.st_uid, info.st_gid, info.st_mode & 0o7777) == (0, NOBODY, 0o640)
        size = info.st_size
        assert size == POLICY_SIZE if name == "policy" else size > 0
    assert secret.read_bytes() == linked.read_bytes() == b"root only\n"
    assert (secret.stat().st_mode & 0o777, linked.stat().st_mode & 0o777) == (0o600, 0o600)


def test_item1_held_directories_refuse_symlinks_fifos_devices_and_hard_links(
        workdir: Path) -> None:
    """The module's refusals, one line each, with nothing opened for I/O first."""
    target = workdir / "target"
    target.write_bytes(b"x")
    (workdir / "link").symlink_to(target)
    os.mkfifo(workdir / "fifo")
    os.mknod(workdir / "device", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    os.link(target, workdir / "hard")
    (workdir / "dir").mkdir()
    (workdir / "mine").write_bytes(b"ok")
    os.chown(workdir / "mine", NOBODY, NOBODY)
    with HeldDir.open(workdir, owner=0) as held:
        for name, says in [("link", "a symlink"), ("fifo", "a FIFO"),
                           ("device", "a device node"), ("hard", "2 links"),
                           ("dir", "a directory"), ("mine", f"uid {NOBODY}")]:
            with pytest.raises(Refused, match=says):
                held.open_file(name, os.O_RDONLY, owner=0)
        fd = held.open_file("mine", os.O_RDONLY, owner=NOBODY)
        assert os.read(fd, 10) == b"ok"
        os.close(fd)
        with pytest.raises(FileNotFoundError):
            held.open_file("absent", os.O_RDONLY, owner=None)
        with pytest.raises(Refused, match="not a directory"):
            held.subdir("link")
        with HeldDir.open(workdir / "dir") as other, \
                pytest.raises(Refused, match=f"uid 0, not {NOBODY}"):
            other.subdir(".", owner=NOBODY)
        assert held.discard("link") and target.exists()  # the link, never its target
        assert not held.discard("dir")  # directories are not unlinked
        assert not held.discard("hard", identity=(0, 0))  # not the file expected
    with pytest.raises(Refused, match="not a directory"):
        HeldDir.open(workdir / "fifo")
    (workdir / "dirlink").symlink_to(workdir / "dir")
    with pytest.raises(Refused, match="not a directory"):
        HeldDir.open(workdir / "dirlink")
