"""The agent as a real process: defaults, signals, reload, systemd notification."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import needs_root, python
from tests.daemons import start_agent, wait_until

pytestmark = pytest.mark.foundation


@needs_root
def test_runs_with_no_configuration_file_at_all(spawn, workdir: Path) -> None:
    # Private mount and network namespaces, with empty /etc/harmonaize, /run and
    # /var/lib, so the built-in defaults are used without touching this machine's
    # paths or NICs.
    script = (
        "mount -t tmpfs tmpfs /run && mount -t tmpfs tmpfs /var/lib && "
        "mkdir -p /etc/harmonaize && mount -t tmpfs tmpfs /etc/harmonaize && "
        f"exec {' '.join(python('agent.main'))}"
    )
    log = workdir / "agent.log"
    with log.open("wb") as out:
        proc = spawn(["unshare", "--mount", "--net", "--propagation", "private", "sh", "-c",
                      script],
                     stdout=out, stderr=subprocess.STDOUT)

    def status() -> dict | None:
        assert proc.poll() is None, log.read_text()
        result = subprocess.run(
            ["nsenter", "-t", str(proc.pid), "-m", *python("harmonaize.harmonctl", "--json",
                                                           "status")],
            capture_output=True, text=True, timeout=30)
        return json.loads(result.stdout) if result.returncode == 0 else None

    found = wait_until(status, what="the agent on /run/harmonaize/agent.sock")
    assert found["config"] is None and found["interval_seconds"] == 0.1
    assert found["ready"] is True and found["uplink"] is None
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


@needs_root
def test_sigterm_stops_cleanly_and_removes_the_socket(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir)
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=10) == 0
    assert not agent.socket.exists()
    assert "stopping" in agent.log.read_text()


@needs_root
def test_sighup_reloads_and_a_bad_file_keeps_the_running_config(spawn, workdir: Path) -> None:
    agent = start_agent(spawn, workdir)
    text = agent.config.read_text()
    agent.config.write_text(text.replace("[agent]\n", "[agent]\ninterval = 0.25\n"))
    agent.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: agent.request("status")["interval_seconds"] == 0.25, what="the reload")
    agent.config.write_text(text.replace("[agent]\n", "[agent]\nintervall = 0.5\n"))
    agent.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "reload refused" in agent.log.read_text(), what="the refusal")
    assert "agent.intervall: unknown key" in agent.log.read_text()
    assert agent.request("status")["interval_seconds"] == 0.25
    with pytest.raises(Exception, match="reload refused"):
        agent.request("reload")
    assert agent.proc.poll() is None


@needs_root
def test_notifies_systemd_ready_status_and_watchdog(spawn, workdir: Path) -> None:
    notify_path = workdir / "notify.sock"
    sink = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sink.bind(str(notify_path))
    sink.settimeout(10)
    env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "200000"}
    agent = start_agent(spawn, workdir, env=env, wait=False)
    received: list[str] = []
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and received.count("WATCHDOG=1") < 3:
        received.append(sink.recv(4096).decode())
    assert received[0] == "STATUS=starting observers"
    ready = next(i for i, m in enumerate(received) if m.startswith("READY=1"))
    assert ready > 0 and "sampling 1 observer(s) every 100 ms" in received[ready]
    assert received.count("WATCHDOG=1") >= 3
    assert all(i > ready for i, m in enumerate(received) if m == "WATCHDOG=1")
    agent.proc.send_signal(signal.SIGTERM)
    tail = []
    while "STOPPING=1" not in tail:
        tail.append(sink.recv(4096).decode())
    assert agent.proc.wait(timeout=10) == 0
    sink.close()


def test_check_mode_starts_observers_reports_and_exits(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[agent]\nlog_level = 'warning'\n[observers.links]\nenabled = false\n")
    result = subprocess.run(python("agent.main", "-c", str(config), "--check", "--json"),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    (host,) = [o for o in json.loads(result.stdout)["observers"] if o["name"] == "host"]
    assert host["state"] == "running"
