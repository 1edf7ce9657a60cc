"""The daemons' life under systemd: READY=1, the watchdog, reload, a clean stop.

Everywhere: a minimal notify listener (a Unix datagram socket set as
``NOTIFY_SOCKET``) plays systemd. Where systemd is the init system (the VMs),
the agent also runs as a transient service with the unit's own hardening.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harmonaize.opsocket import request
from testbed.fakegpu import STATE_ENV
from tests.conftest import ROOT
from tests.daemons import (
    NO_LINKS,
    agent_config,
    fake_gpus,
    gpu_section,
    start_controller,
    wait_until,
)
from tests.ops.test_units import AGENT, service

pytestmark = pytest.mark.ops


class NotifyListener:
    """What systemd's notify socket would receive, one datagram per entry."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.2)
        self.messages: list[dict[str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append(fields)

    def count(self, key: str, value: str = "1") -> int:
        return sum(1 for m in list(self.messages) if m.get(key) == value)

    def index(self, key: str, value: str = "1") -> int:
        return next(i for i, m in enumerate(list(self.messages)) if m.get(key) == value)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture
def notify(workdir: Path) -> Iterator[NotifyListener]:
    listener = NotifyListener(workdir / "notify.sock")
    yield listener
    listener.close()


def test_agent_ready_watchdog_reload_and_clean_stop(spawn, workdir: Path,
                                                    notify: NotifyListener) -> None:
    _, env = fake_gpus(workdir, gpus=2)
    config = agent_config(workdir, "n1", links=NO_LINKS + gpu_section())
    env = {**env, "NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": "200000"}
    log = workdir / "n1.log"
    with log.open("wb") as out:
        proc = spawn([sys.executable, "-m", "agent.main", "-c", str(config)], env=env,
                     stdout=out, stderr=subprocess.STDOUT)
    wait_until(lambda: notify.count("READY") or proc.poll() is not None, 60, "READY=1")
    assert proc.poll() is None, log.read_text()
    ready = notify.messages[notify.index("READY")]
    assert "sampling" in ready["STATUS"]
    # READY=1 comes only once the operator socket serves.
    assert request(workdir / "n1.sock", "status")["ready"] is True
    # The sampling loop pings at half of WATCHDOG_USEC.
    before = notify.count("WATCHDOG")
    wait_until(lambda: notify.count("WATCHDOG") >= before + 5, 20, "five watchdog pings")

    proc.send_signal(signal.SIGHUP)
    wait_until(lambda: notify.count("RELOADING"), 20, "RELOADING=1")
    wait_until(lambda: notify.count("READY") >= 2, 20, "READY=1 after the reload")
    assert notify.index("RELOADING") < len(notify.messages) - 1

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, log.read_text()
    assert notify.count("STOPPING") == 1
    assert not (workdir / "n1.sock").exists()


def test_controller_ready_and_clean_stop(spawn, workdir: Path, notify: NotifyListener,
                                         monkeypatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify.path))
    controller = start_controller(spawn, workdir)
    wait_until(lambda: notify.count("READY"), 30, "the controller's READY=1")
    assert "known hosts" in notify.messages[notify.index("READY")]["STATUS"]
    controller.proc.send_signal(signal.SIGTERM)
    assert controller.proc.wait(30) == 0, controller.log.read_text()
    assert notify.count("STOPPING") == 1


# --- under systemd itself ------------------------------------------------------------

under_systemd = pytest.mark.skipif(
    not Path("/run/systemd/system").is_dir() or os.geteuid() != 0 or not shutil.which(
        "systemd-run"),
    reason="systemd is not the init system here (it is in the Vagrant VMs: "
    "./scripts/test --vagrant)")

#: Unit settings that point at the installed layout; the test brings its own.
NOT_TRANSIENT = {"ExecStart", "ExecReload", "StateDirectory", "StateDirectoryMode",
                 "RuntimeDirectory", "RuntimeDirectoryMode", "SupplementaryGroups",
                 "WatchdogSec", "ProtectHome"}


def unit_properties() -> list[str]:
    """The agent unit's [Service] settings as systemd-run properties, in order."""
    return [f"--property={key}={value}" for key, values in service(AGENT).items()
            if key not in NOT_TRANSIENT for value in values]


def systemctl_show(unit: str, *names: str) -> dict[str, str]:
    done = subprocess.run(["systemctl", "show", unit, *(f"--property={n}" for n in names)],
                          capture_output=True, text=True, timeout=30, check=True)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)


@contextlib.contextmanager
def transient_unit(name: str) -> Iterator[Callable[..., dict[str, str]]]:
    try:
        yield lambda *names: systemctl_show(name, *names)
    finally:
        subprocess.run(["systemctl", "stop", name], capture_output=True, timeout=60)
        subprocess.run(["systemctl", "reset-failed", name], capture_output=True, timeout=30)


@under_systemd
def test_agent_as_a_hardened_service_reaches_ready_and_stops_cleanly() -> None:
    # Under /run: the unit's PrivateTmp= would hide a directory in /tmp.
    work = Path(tempfile.mkdtemp(prefix="hz-unit-", dir="/run"))
    name = f"hz-test-agent-{os.getpid()}.service"
    try:
        fake, env = fake_gpus(work, gpus=2)
        config = agent_config(work, "u1", links=NO_LINKS + gpu_section())
        with transient_unit(name) as show:
            started = subprocess.run(
                ["systemd-run", f"--unit={name}", *unit_properties(),
                 "--property=WatchdogSec=2s", f"--property=ReadWritePaths={work}",
                 # The checkout may live under /home, which the unit hides.
                 "--property=ProtectHome=no", f"--setenv={STATE_ENV}={env[STATE_ENV]}",
                 f"--working-directory={ROOT}", "--",
                 sys.executable, "-m", "agent.main", "-c", str(config)],
                capture_output=True, text=True, timeout=240)
            # For Type=notify, systemd-run returns once READY=1 arrived (or the start failed).
            assert started.returncode == 0, started.stderr + _journal(name)
            state = show("ActiveState", "SubState", "MainPID")
            assert state["ActiveState"] == "active" and state["SubState"] == "running"
            pid = int(state["MainPID"])
            status = request(work / "u1.sock", "status")
            assert status["ready"] and status["pid"] == pid
            assert {o["name"]: o["state"] for o in status["observers"]}["gpu"] == "running"
            bounding = int(_proc_status(pid)["CapBnd"], 16)
            # CAP_DAC_READ_SEARCH, CAP_NET_ADMIN, CAP_SYS_PTRACE, CAP_SYSLOG, CAP_PERFMON,
            # CAP_BPF
            assert bounding == sum(1 << bit for bit in (2, 12, 19, 34, 38, 39)), hex(bounding)
            # Three watchdog periods later it was not killed: the loop feeds the watchdog.
            time.sleep(6)
            state = show("ActiveState", "MainPID", "NRestarts")
            assert state == {"ActiveState": "active", "MainPID": str(pid), "NRestarts": "0"}
            subprocess.run(["systemctl", "stop", name], check=True, timeout=60)
            result = show("Result", "ExecMainStatus", "ActiveState")
            assert result["Result"] == "success" and result["ExecMainStatus"] == "0", (
                result, _journal(name))
            assert not (work / "u1.sock").exists()
            assert fake.path.exists()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _proc_status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


def _journal(unit: str) -> str:
    done = subprocess.run(["journalctl", "-u", unit, "--no-pager", "-n", "50"],
                          capture_output=True, text=True, timeout=30)
    return "\n" + done.stdout
