"""Keys that do not fit: every client ends within its timeout in one clear line
and a non-zero exit, and the server counts (and logs) the attempt."""

from __future__ import annotations

import resource
import socket
import subprocess
import time
from pathlib import Path

import pytest
import zmq

from harmonaize import keys
from harmonaize import messages as m
from tests.conftest import needs_root, python
from tests.daemons import FakeAgent, keyring, start_controller, wait_until

pytestmark = [pytest.mark.hardening, pytest.mark.controller, needs_root]


def watch(controller, key: Path, server_key: Path, timeout: float = 4.0
          ) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    result = subprocess.run(
        python("harmonaize.tenant.cli", "watch", "--feed", controller.feed, "--key", str(key),
               "--server-key", str(server_key), "--timeout", str(timeout)),
        capture_output=True, text=True, timeout=timeout + 30)
    return result, time.monotonic() - began


def test_an_unfiled_tenant_key_ends_in_one_line_and_is_counted(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    stranger = keyring(workdir).tenant("mallory", allowed=False)
    result, took = watch(controller, stranger.key, stranger.server_key)
    assert result.returncode == 1, result
    (line,) = result.stderr.strip().splitlines()
    assert "the controller refused this key" in line and "mallory" not in line, line
    assert took < 4.0 + 10  # it ended by itself, within its timeout and a start-up
    refused = controller.request("status")["auth"]["refused"]
    assert sum(refused.values()) >= 1


def test_a_wrong_server_key_ends_in_one_line(spawn, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    alpha = keyring(workdir).tenant("alpha")
    other_public, _ = keys.generate(workdir / "other", "controller")
    result, _ = watch(controller, alpha.key, other_public)
    assert result.returncode == 1, result
    (line,) = result.stderr.strip().splitlines()
    assert "no answer from" in line and "server key" in line, line
    wait_until(lambda: controller.request("status")["handshakes_failed"].get("feed", 0) >= 1,
               what="the failed handshake counted")


def test_plain_connections_to_the_agent_port_are_counted_and_logged(
    spawn, workdir: Path
) -> None:
    controller = start_controller(spawn, workdir)
    ctx = zmq.Context()
    try:
        for _ in range(3):
            plain = ctx.socket(zmq.DEALER)
            plain.setsockopt(zmq.LINGER, 0)
            plain.connect(controller.listen)
            plain.send(b"hello?")
            time.sleep(0.3)
            plain.close()
    finally:
        ctx.destroy(linger=0)
    wait_until(lambda: controller.request("status")["handshakes_failed"].get("agents", 0) >= 3,
               what="the failed handshakes counted")
    assert "handshake failed on the agent port" in controller.log.read_text()


def test_a_flood_of_idle_connections_starves_no_one(spawn, workdir: Path) -> None:
    """1,100 TCP connections that never handshake: agents, tenants and the admin
    socket still get answers, the connections are counted, and they time out."""
    controller = start_controller(spawn, workdir)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4096), max(hard, 4096)))
    host, port = controller.listen.removeprefix("tcp://").rsplit(":", 1)
    idle = []
    try:
        for _ in range(1100):
            idle.append(socket.create_connection((host, int(port))))
        # Counted as accepted, not as open at one moment: on a slow machine the first
        # ones reach their handshake timeout before the last are accepted.
        wait_until(lambda: controller.request("status")["ports"]["agents"]["accepted"] >= 1000,
                   what="the idle connections seen")
        ctx = zmq.Context()
        try:
            assert FakeAgent(ctx, controller, "h1").hello() == m.Ack(0)
        finally:
            ctx.destroy(linger=0)
        status = controller.request("status")
        assert status["descriptors"]["limit"] >= 4096
        # Every connection still open holds one of the controller's descriptors.
        assert status["descriptors"]["open"] > status["ports"]["agents"]["open"]
        # Never handshaken: each is dropped after the handshake timeout, and counted.
        wait_until(lambda: controller.request("status")["ports"]["agents"]["open"] < 10,
                   timeout=60, what="the idle connections dropped")
        assert controller.request("status")["handshakes_failed"]["agents"] >= 1000
    finally:
        for sock in idle:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
