"""Fixtures shared by the suite: scratch directories, tracked processes, labs."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import zmq
from hypothesis import settings

from harmonaize import statemachine, wireaudit
from testbed.netns import Lab
from tests.wirecheck import Audit

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"

# The test harness (testbed/) lives beside the installed packages, not in them: the
# subprocesses the tests start ("python -m testbed.fakesmi" and the like, some from an
# agent's configuration) find it through PYTHONPATH.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)

# Illegal state moves raise under test, in this process and in the daemons it starts
# (harmonaize.statemachine); in production they are counted and refused.
os.environ[statemachine.STRICT_ENV] = "1"
statemachine.set_strict(True)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

# Property tests draw the same examples on every machine and run under CI and
# ./scripts/test: a failure found once is found again (and kept as an @example), and a
# green run on one machine is green on a fresh one. No examples database (it would make
# a run depend on what an earlier run on that machine found), and a failure prints the
# blob that reproduces it. No deadline: the suite never asserts wall-clock time.
# HYPOTHESIS_PROFILE=explore draws new examples (and keeps failures in .hypothesis/).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True,
                          deadline=None)
settings.register_profile("explore", derandomize=False, print_blob=True, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE")
                      or ("ci" if os.environ.get("CI") else "default"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--vagrant", action="store_true", default=False,
                     help="take the integration tests' hosts from the Vagrant VMs "
                     "(Vagrantfile) instead of network namespaces")


@pytest.fixture(scope="session")
def host_kind(request: pytest.FixtureRequest) -> str:
    """Where integration tests get their hosts: "netns" (default) or "vagrant" (--vagrant)."""
    if not request.config.getoption("--vagrant"):
        return "netns"
    from testbed import vagrant  # noqa: PLC0415 - only with --vagrant

    reason = vagrant.not_up(ROOT)
    if reason is not None:
        pytest.skip(f"--vagrant: {reason}")
    return "vagrant"


@pytest.fixture(scope="session")
def wire_audit() -> Iterator[Audit]:
    """Every process of the session writes what it encodes for tenants here."""
    path = Path(tempfile.mkdtemp(prefix="hz-wire-audit-"))
    previous = os.environ.get(wireaudit.ENV)
    os.environ[wireaudit.ENV] = str(path)  # the daemons the tests start inherit it
    wireaudit.install(str(path))  # and this process, for the in-memory tests
    yield Audit(path)
    if previous is None:
        os.environ.pop(wireaudit.ENV, None)
    else:
        os.environ[wireaudit.ENV] = previous
    wireaudit.install()
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def conforms_to_the_spec(wire_audit: Audit) -> Iterator[None]:
    """After each test (and its processes' teardown): whatever was sent to or by a
    tenant validates against the published spec, docs/feed.asyncapi.yaml."""
    yield
    found = wire_audit.check()
    if found:
        pytest.fail(f"{len(found)} tenant-facing messages do not match "
                    f"docs/feed.asyncapi.yaml, e.g.:\n" + "\n".join(found[:5]), pytrace=False)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A scratch directory other users can traverse (sockets for non-root clients)."""
    path = Path(tempfile.mkdtemp(prefix="hz-test-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


Spawn = Callable[..., subprocess.Popen[Any]]


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    """Start a real subprocess; every one is stopped at teardown, pass or fail."""
    started: list[subprocess.Popen[Any]] = []

    def start(argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(list(argv), **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    """A ZeroMQ context for a test's raw sockets, destroyed without lingering."""
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def python(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


@pytest.fixture
def make_lab() -> Iterator[Callable[..., Lab]]:
    """Create labs of namespace hosts that are always torn down."""
    labs: list[Lab] = []

    def create(hosts: Sequence[str], **kwargs: Any) -> Lab:
        lab = Lab(hosts, **kwargs)
        labs.append(lab)
        lab.create()
        return lab

    yield create
    for lab in labs:
        lab.close()
