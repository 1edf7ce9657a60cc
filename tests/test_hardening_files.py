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

import ast
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
from agent.plugin.hostilefs import HeldDir, Refused, describe
from agent.plugin.layout import POLICY_SIZE, Policy, encode_policy
from agent.plugin.shm import job_dir, prepare_dirs, prepare_job_dir, read_stats
from agent.tuning.loop import WritePolicy
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from harmonaize.messages import Algorithm, Collective, JobDeclaration, Protocol, TuningRange
from testbed.tuningsim import link_judgements, link_sample
from tests.conftest import needs_root

pytestmark = [pytest.mark.hardening, needs_root]

ROOT = Path(__file__).resolve().parent.parent
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


# ---- The architecture: only agent/plugin/hostilefs.py touches the policy directory. ----

#: Functions of os, os.path and shutil that take a path by name (those on descriptors,
#: os.fstat, os.pread, os.close, are fine: a descriptor is what hostilefs hands out).
OS_PATH_FUNCTIONS = frozenset({
    "open", "unlink", "remove", "rename", "renames", "replace", "chmod", "chown", "lchown",
    "mkdir", "makedirs", "rmdir", "removedirs", "listdir", "scandir", "stat", "lstat",
    "symlink", "link", "mkfifo", "mknod", "readlink", "walk", "access", "utime", "truncate",
    "chdir", "exists", "lexists", "isdir", "isfile", "islink", "getsize", "getmtime",
    "realpath", "samefile"})
#: Methods only pathlib.Path has (and io's open): any call of them is a path's.
PATH_METHODS = frozenset({
    "open", "stat", "lstat", "write_text", "write_bytes", "read_text", "read_bytes",
    "unlink", "chmod", "lchmod", "rmdir", "mkdir", "iterdir", "glob", "rglob", "exists",
    "is_dir", "is_file", "is_symlink", "is_fifo", "is_char_device", "is_block_device",
    "is_socket", "touch", "symlink_to", "hardlink_to", "link_to", "rename", "samefile",
    "readlink"})
#: The one module allowed to, and the receiver through which others use it.
ALLOWED_MODULE = "agent/plugin/hostilefs.py"
ALLOWED_RECEIVERS = frozenset({"HeldDir"})
#: Traffic control: its one path is the BPF source shipped with the agent (checked below
#: to know nothing of the policy directory).
NOT_NEAR = frozenset({"agent/tuning/htb.py"})
#: What a module imports to reach the policy directory's files.
FILE_CODE = frozenset({"agent.plugin.shm", "agent.plugin.statsread", "agent.plugin.hostilefs"})
FILE_NAMES = frozenset({"shm", "hostilefs", "PolicyFile", "read_policy", "read_stats"})


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return ""


def raw_path_calls(source: str) -> list[str]:
    """Every call in ``source`` that may touch a path by name: ``open()``, a path
    function of os, os.path or shutil, a pathlib method (``.replace(x)``: Path's has one
    argument, str's two, dataclasses' keywords) -- except through :class:`HeldDir`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        where = f"line {node.lineno}: {ast.unparse(func)}()"
        if isinstance(func, ast.Name):
            if func.id == "open":
                found.append(where)
            continue
        if not isinstance(func, ast.Attribute):
            continue
        receiver = _dotted(func.value)
        if receiver in ALLOWED_RECEIVERS:
            continue
        by_name = receiver == "shutil" or (receiver in ("os", "os.path", "io")
                                           and func.attr in OS_PATH_FUNCTIONS)
        path_method = receiver not in ("os", "os.path", "dataclasses") and (
            func.attr in PATH_METHODS
            or (func.attr == "replace" and len(node.args) == 1 and not node.keywords))
        if by_name or path_method:
            found.append(where)
    return found


def _reaches_file_code(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module in FILE_CODE or (
                node.module == "agent.tuning"
                and {alias.name for alias in node.names} & FILE_NAMES)):
            return True
        if isinstance(node, ast.Import) and {a.name for a in node.names} & FILE_CODE:
            return True
    return False


def modules_near_the_policy_directory() -> list[Path]:
    """agent/tuning/*, and every agent module that imports its file code."""
    near = set((ROOT / "agent" / "tuning").glob("*.py"))
    near |= {path for path in (ROOT / "agent").rglob("*.py")
             if _reaches_file_code(ast.parse(path.read_text()))}
    return sorted(path for path in near
                  if str(path.relative_to(ROOT)) not in NOT_NEAR | {ALLOWED_MODULE})


def test_item1_no_agent_code_but_hostilefs_touches_a_tenant_writable_directory() -> None:
    modules = modules_near_the_policy_directory()
    names = {str(path.relative_to(ROOT)) for path in modules}
    assert {"agent/plugin/shm.py", "agent/tuning/service.py",
            "agent/energy/service.py"} <= names
    offenders = {str(path.relative_to(ROOT)): calls for path in modules
                 if (calls := raw_path_calls(path.read_text()))}
    assert offenders == {}, "only agent/plugin/hostilefs.py may touch these paths"
    for exempt in NOT_NEAR:
        text = (ROOT / exempt).read_text()
        assert not _reaches_file_code(ast.parse(text)) and "policy" not in text


@pytest.mark.parametrize("raw", [
    "Path(p).write_text('x')", "os.open(p, os.O_RDONLY)", "open(p)", "os.chown(p, 0, 0)",
    "tmp.chmod(0o640)", "os.replace(a, b)", "shutil.rmtree(d)", "os.listdir(d)",
    "(d / n).is_dir()", "p.unlink(missing_ok=True)", "tmp.replace(p)", "p.stat()",
    "os.path.exists(p)", "p.open('w')"])
def test_item1_the_architecture_scan_catches_a_raw_call(raw: str) -> None:
    """The scan above can fail: each of these, added to agent/tuning, is reported."""
    assert raw_path_calls(f"def f(p, a, b, d, n, tmp):\n    {raw}\n") != []
    assert raw_path_calls("def f(p, s, x):\n    HeldDir.open(p)\n    os.fstat(3)\n"
                          "    s.replace('a', 'b')\n    dataclasses.replace(x, a=1)\n") == []


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

