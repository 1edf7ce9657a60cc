"""A controller, host agents and a tenant watcher running in a :class:`Lab`.

The demo and the integration tests drive the same scenario through this class;
every daemon is the real program in a real process, with its own
configuration file and log under ``workdir``.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harmonaize.opsocket import CommandError, request
from testbed.fakegpu import STATE_ENV, FakeNvml, library_path
from testbed.fakekmsg import FakeKernelLog
from testbed.keyring import Keyring
from testbed.netns import Lab

AGENT_PORT = 7400
FEED_PORT = 7401
#: A lab has two or three hosts: aggregate them at once. The product's defaults
#: publish only aggregates of 5 or more hosts, at most every 10 s (plus jitter).
SMALL_CLUSTER = "[redaction]\nmode = \"redacted\"\nmin_hosts = 1\nmin_interval = 0\njitter = 0\n"
#: The pool and GPU-class names tests' hosts report: tenants see only declared names.
TEST_POOLS = ('[pools]\nnames = ["default", "p", "p1", "p2", "east", "west", "pair", "tiny", '
              '"scale"]\ngpu_classes = ["H200", "H100", "A100", "none"]\n')


class Timeout(AssertionError):
    pass


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Timeout(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


@dataclass
class TenantWatcher:
    """A ``harmonaize-tenant watch --json`` process; its messages land in a queue."""

    proc: subprocess.Popen[str]
    messages: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def start(self) -> None:
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.messages.put(json.loads(line))
            except ValueError:
                continue

    def next(self, timeout: float) -> dict[str, Any] | None:
        try:
            message = self.messages.get(timeout=timeout)
        except queue.Empty:
            return None
        self.seen.append(message)
        return message

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float,
                 what: str, on_message: Callable[[dict[str, Any]], None] | None = None,
                 ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            message = self.next(remaining)
            if message is None:
                break
            if on_message is not None:
                on_message(message)
            if predicate(message):
                return message
        raise Timeout(f"the tenant did not see {what} within {timeout:g} s")


class TestCluster:
    """Lays out hosts: ``controller``, ``tenant`` and agent hosts in one lab."""

    __test__ = False  # not a pytest class

    def __init__(self, lab: Lab, workdir: Path, *, agent_overrides: str = "",
                 controller_overrides: str = "", notice_lead: float = 2.0) -> None:
        self.lab = lab
        #: Seconds ahead the agents announce a validation of a GPU a job uses.
        self.notice_lead = notice_lead
        self.workdir = workdir
        self.agent_overrides = agent_overrides
        self.controller_overrides = controller_overrides
        self.agents: dict[str, subprocess.Popen[Any]] = {}
        self.controller: subprocess.Popen[Any] | None = None
        #: Each agent host's fake GPUs, for scenarios to break.
        self.gpus: dict[str, FakeNvml] = {}
        #: Each host's fake kernel log (the driver's XID lines), kept across restarts.
        self.kmsg: dict[str, FakeKernelLog] = {}
        #: Every daemon and tenant authenticates with CurveZMQ, as in production.
        self.keys = Keyring(workdir / "keys")

    # --- paths -----------------------------------------------------------------------

    def socket(self, host: str) -> Path:
        return self.workdir / f"{host}.sock"

    @property
    def admin_socket(self) -> Path:
        return self.workdir / "controller.sock"

    @property
    def feed(self) -> str:
        return f"tcp://{self.lab.addr('controller')}:{FEED_PORT}"

    def log(self, name: str) -> Path:
        return self.workdir / f"{name}.log"

    # --- processes -------------------------------------------------------------------

    def start_controller(self, timeout: float = 20.0) -> None:
        cfg = self.workdir / "controller.toml"
        addr = self.lab.addr("controller")
        cfg.write_text(
            "[controller]\n"
            f'listen = "tcp://{addr}:{AGENT_PORT}"\n'
            f'feed = "tcp://{addr}:{FEED_PORT}"\n'
            f'admin_socket = "{self.admin_socket}"\n'
            f'database = "{self.workdir / "controller.db"}"\n'
            + (self.controller_overrides or SMALL_CLUSTER)
            + ("" if "[pools]" in self.controller_overrides else TEST_POOLS)
            + self.keys.controller_config()
        )
        self.controller = self.lab.popen(
            "controller", [sys.executable, "-m", "controller.main", "-c", str(cfg)],
            log=self.log("controller"),
        )
        self._wait_serving(self.admin_socket, self.controller, "controller", timeout)

    def policy_dir(self, host: str) -> Path:
        """Where ``host``'s agent publishes tuner policies (its own: hosts share a disk)."""
        return self.workdir / host / "tuner"

    def start_agent(self, host: str, timeout: float = 20.0, extra: str = "",
                    gpus: int = 8, tuning: str = "") -> None:
        """Start ``host``'s agent, with ``gpus`` simulated GPUs (kept across restarts).

        ``tuning`` holds more keys for its [tuning] section; ``extra`` other sections.
        """
        cfg = self.workdir / f"{host}.toml"
        gpu_section = "[observers.gpu]\nenabled = false\n"
        env = dict(os.environ)
        validation = ""
        if gpus:
            fake = self.gpus.get(host) or FakeNvml(self.workdir / f"{host}.gpus", gpus=gpus)
            self.gpus[host] = fake
            env[STATE_ENV] = str(fake.path)
            kmsg = self.kmsg.get(host) or FakeKernelLog(self.workdir / f"{host}.kmsg")
            self.kmsg[host] = kmsg
            gpu_section = (f'[observers.gpu]\nnvml_library = "{library_path()}"\n'
                           f'kmsg_path = "{kmsg.path}"\n')
            # A burn test with this GPU class's baseline, as an operator would configure.
            validation = (
                f"[validation]\nnotice_lead = {self.notice_lead:g}\n"
                "[[validation.commands]]\nname = \"burn\"\n"
                f'command = ["{sys.executable}", "-m", "testbed.burn", "{{gpu}}"]\n'
                'parser = "metrics"\nbudget = 30\nbaselines = { tflops = 989 }\n'
            )
        cfg.write_text(
            "[agent]\n"
            f'host_id = "{host}"\n'
            f'state_dir = "{self.workdir / host}"\n'
            "[socket]\n"
            f'path = "{self.socket(host)}"\n'
            "[controller]\n"
            f'endpoint = "tcp://{self.lab.addr("controller")}:{AGENT_PORT}"\n'
            + self.keys.agent_config(host) + self.agent_overrides + gpu_section + validation
            + f'[tuning]\npolicy_dir = "{self.policy_dir(host)}"\n' + tuning + extra
        )
        proc = self.lab.popen(
            host, [sys.executable, "-m", "agent.main", "-c", str(cfg)], log=self.log(host),
            env=env,
        )
        self.agents[host] = proc
        self._wait_serving(self.socket(host), proc, host, timeout)

    def stop_agent(self, host: str, sig: signal.Signals = signal.SIGTERM,
                   timeout: float = 10.0) -> int:
        proc = self.agents.pop(host)
        proc.send_signal(sig)
        return proc.wait(timeout=timeout)

    def _wait_serving(self, path: Path, proc: subprocess.Popen[Any], what: str,
                      timeout: float) -> None:
        def serving() -> bool:
            if proc.poll() is not None:
                tail = self.log(what).read_text()[-2000:]
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{tail}")
            try:
                request(path, "status", timeout=1.0)
            except (OSError, CommandError, ValueError):
                return False
            return True

        wait_until(serving, timeout, f"{what} to serve {path}")

    def tenant_watch(self, topics: tuple[str, ...] = ("pool/",),
                     tenant: str = "acme") -> TenantWatcher:
        creds = self.keys.tenant(tenant)
        argv = [sys.executable, "-m", "harmonaize.tenant.cli", "watch", "--json",
                "--feed", self.feed, "--key", str(creds.key),
                "--server-key", str(creds.server_key)]
        for topic in topics:
            argv += ["--topic", topic]
        proc = self.lab.popen("tenant", argv, stdout=subprocess.PIPE, text=True)
        watcher = TenantWatcher(proc)
        watcher.start()
        return watcher

    def tenant_cli(self, *args: str, tenant: str = "acme") -> subprocess.CompletedProcess[str]:
        """Run ``harmonaize-tenant ARGS`` as ``tenant``, from the tenant's namespace."""
        creds = self.keys.tenant(tenant)
        command, *rest = args
        argv = [sys.executable, "-m", "harmonaize.tenant.cli", command, "--feed", self.feed,
                "--key", str(creds.key), "--server-key", str(creds.server_key), *rest]
        return self.lab.run("tenant", argv, timeout=60)

    def agent_request(self, host: str, cmd: str, args: dict[str, Any] | None = None) -> Any:
        return request(self.socket(host), cmd, args)

    def admin_request(self, cmd: str, args: dict[str, Any] | None = None) -> Any:
        return request(self.admin_socket, cmd, args)

    def harmonctl(self, host: str, *args: str) -> str:
        argv = [sys.executable, "-m", "harmonaize.harmonctl", "-s", str(self.socket(host)), *args]
        return self.lab.run(host, argv).stdout
