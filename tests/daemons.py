"""Start the real daemons as subprocesses for tests."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq

from harmonaize import keys
from harmonaize import messages as m
from harmonaize.messages import decode, encode
from harmonaize.opsocket import CommandError, request
from harmonaize.tenant.client import FeedClient
from testbed.cluster import TEST_POOLS
from testbed.fakegpu import STATE_ENV, FakeNvml, library_path
from testbed.keyring import Credentials, Keyring
from testbed.netns import Lab
from tests.conftest import Spawn, free_port, python


def wait_until(predicate: Callable[[], Any], timeout: float = 45.0, what: str = "it") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def serving(path: Path, proc: subprocess.Popen[Any], log: Path) -> Callable[[], bool]:
    def check() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"daemon exited with {proc.returncode}:\n{log.read_text()}")
        try:
            request(path, "status", timeout=1.0)
        except (OSError, CommandError, ValueError):
            return False
        return True

    return check


@dataclass
class Agent:
    proc: subprocess.Popen[Any]
    socket: Path
    config: Path
    log: Path

    def request(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        return request(self.socket, cmd, args)


#: Tests run one or two hosts: let aggregates through at once (the product's
#: defaults hold them back until 5 hosts and 10 s apart; tests/controller/test_redaction
#: covers those rules).
SMALL_CLUSTER = "[redaction]\nmode = \"redacted\"\nmin_hosts = 1\nmin_interval = 0\njitter = 0\n"

#: Agents in the test's own namespace must not attach to this machine's NICs.
NO_LINKS = "[observers.links]\nenabled = false\n"


def keyring(workdir: Path) -> Keyring:
    """The test's keys (one controller per test directory)."""
    return Keyring(workdir / "keys")


def tenant_feed(controller: Controller, topics: list[str], tenant: str = "acme",
                **kwargs: Any) -> FeedClient:
    """A tenant's feed client, with a key the controller knows (under ``tenant``): a key
    filed just now is waited for until the controller has read it (it rescans its keys
    directory; a handshake before then is refused, and the client says so)."""
    ring = keyring(controller.workdir)
    creds = ring.tenant(tenant)
    filed = len(list((ring.root / "tenants").glob(f"*{keys.PUBLIC_SUFFIX}")))
    wait_until(lambda: controller.request("status")["auth"].get("tenants_allowed", filed)
               >= filed, 30, f"the controller to read tenant {tenant}'s key")
    return FeedClient(controller.feed, topics, key=creds.key, server_key=creds.server_key,
                      **kwargs)


def agent_config(workdir: Path, name: str, extra: str = "", endpoint: str = "",
                 group: str = "", links: str = NO_LINKS) -> Path:
    """``extra`` goes in the [controller] section; ``links`` is appended (any sections).

    With an endpoint the agent gets a key pair the test's controller allows,
    unless ``extra`` says otherwise (e.g. ``server_key = ""``).
    """
    path = workdir / f"{name}.toml"
    auth = (keyring(workdir).agent_config(name)
            if endpoint and "server_key" not in extra else "")
    path.write_text(
        f'[agent]\nhost_id = "{name}"\nstate_dir = "{workdir / name}"\n'
        f'[socket]\npath = "{workdir / name}.sock"\ngroup = "{group}"\n'
        f'[controller]\nendpoint = "{endpoint}"\n' + auth + extra + links
        # Each test agent keeps its tuning policies to itself, and leaves the
        # machine's interfaces alone, unless the test configures tuning itself.
        + ("" if "[tuning]" in extra + links else
           f'[tuning]\npolicy_dir = "{workdir / name / "tuner"}"\nhtb = false\n')
    )
    return path


def start_agent(spawn: Spawn, workdir: Path, name: str = "h1", extra: str = "",
                endpoint: str = "", group: str = "", env: dict[str, str] | None = None,
                wait: bool = True, links: str = NO_LINKS, lab: Lab | None = None,
                host: str | None = None) -> Agent:
    """Start an agent; with ``lab``, inside that lab's namespace ``host`` (default: name)."""
    config = agent_config(workdir, name, extra, endpoint, group, links)
    log = workdir / f"{name}.log"
    argv = python("agent.main", "-c", str(config))
    if lab is not None:
        argv = lab.cmd(host or name, argv)
    with log.open("ab") as out:
        proc = spawn(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    agent = Agent(proc, workdir / f"{name}.sock", config, log)
    if wait:
        wait_until(serving(agent.socket, proc, log), what=f"agent {name}")
    return agent


@dataclass
class Controller:
    proc: subprocess.Popen[Any]
    listen: str
    feed: str
    admin: Path
    config: Path
    log: Path
    workdir: Path

    def request(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        return request(self.admin, cmd, args)


def start_controller(spawn: Spawn, workdir: Path, extra: str = "",
                     ports: tuple[int, int] | None = None, admin_group: str = "",
                     args: Sequence[str] = (), database: Path | None = None,
                     wrap: Sequence[str] = ()) -> Controller:
    """``args`` go to the controller's command line (e.g. ``--initialise``); ``wrap``
    comes before it (e.g. nsenter into a mount namespace); ``database`` defaults to
    the work directory's controller.db."""
    listen_port, feed_port = ports or (free_port(), free_port())
    database = database or workdir / "controller.db"
    listen = f"tcp://127.0.0.1:{listen_port}"
    feed = f"tcp://127.0.0.1:{feed_port}"
    admin = workdir / "controller.sock"
    config = workdir / "controller.toml"
    auth = "" if "[auth]" in extra else keyring(workdir).controller_config()
    config.write_text(
        f'[controller]\nlisten = "{listen}"\nfeed = "{feed}"\nadmin_socket = "{admin}"\n'
        f'database = "{database}"\nadmin_group = "{admin_group}"\n' + extra
        + ("" if "[redaction]" in extra else SMALL_CLUSTER)
        + ("" if "[pools]" in extra else TEST_POOLS) + auth
    )
    log = workdir / "controller.log"
    with log.open("ab") as out:
        proc = spawn([*wrap, *python("controller.main", "-c", str(config), *args)],
                     stdout=out, stderr=subprocess.STDOUT)
    wait_until(serving(admin, proc, log), what="controller")
    return Controller(proc, listen, feed, admin, config, log, workdir)


def fake_gpus(workdir: Path, gpus: int = 8) -> tuple[FakeNvml, dict[str, str]]:
    """A fake NVML state file, and the environment an agent needs to use it."""
    fake = FakeNvml(workdir / "gpus.state", gpus=gpus)
    fake.save()
    return fake, {**os.environ, STATE_ENV: str(fake.path)}


def gpu_section(call_timeout: float = 0.5, extra: str = "") -> str:
    return (f'[observers.gpu]\nnvml_library = "{library_path()}"\n'
            f"call_timeout = {call_timeout}\nslow_interval = 0.2\n" + extra)


class FakeAgent:
    """A raw DEALER speaking the real protocol (or not, on purpose)."""

    def __init__(self, ctx: zmq.Context, controller: Controller, host: str = "h1",
                 creds: Credentials | None = None, *, plain: bool = False) -> None:
        """With ``plain``, no CurveZMQ (for a controller with auth.mode = "none")."""
        self.host = host
        if not plain and creds is None:
            creds = keyring(controller.workdir).agent(host)
        self.sock = curve_dealer(ctx, controller, None if plain else creds)

    def send(self, body: m.Message, seq: int = 0) -> None:
        self.sock.send(encode(body, sender=self.host, seq=seq))

    def recv(self, timeout: float = 5.0) -> m.Message:
        assert self.sock.poll(int(timeout * 1000)), "no reply from the controller"
        return decode(self.sock.recv()).body

    def hello(self, epoch: int = 1, acked: int = 0, pool: str = "p") -> m.Message:
        self.send(m.Hello(pool=pool, gpu_class="H200", gpus=8, version="t", epoch=epoch,
                          acked=acked, heartbeat=1.0))
        return self.recv()

    def close(self) -> None:
        self.sock.close()


def curve_dealer(ctx: zmq.Context, controller: Controller, creds: Credentials | None,
                 endpoint: str | None = None, options: dict[int, int] | None = None,
                 ) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    for option, value in (options or {}).items():  # before connecting, or they do not apply
        sock.setsockopt(option, value)
    if creds is not None:
        keys.curve_client(sock, keys.load_pair(creds.key), keys.load_public(creds.server_key))
    sock.connect(endpoint or controller.listen)
    return sock
