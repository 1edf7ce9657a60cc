"""Fixtures shared by the cluster tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.natscluster import nats_server, wait_for
from tests.conftest import free_port


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """One real nats-server with JetStream on loopback, stopped after the test."""
    port = free_port()
    log = (tmp_path / "nats.log").open("wb")
    proc = subprocess.Popen([nats_server(), "-a", "127.0.0.1", "-p", str(port), "-js",
                             "-sd", str(tmp_path / "js")], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: b"Server is ready" in (tmp_path / "nats.log").read_bytes(), 30,
                 "nats-server")
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
