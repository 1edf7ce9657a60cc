"""Issue 28, item 6: a full disk pauses the controller's writes; it never ends it.

The controller's database lies on a small tmpfs of its own, mounted in a private mount
namespace that a holder process keeps (the controller is started inside it with
nsenter). When the holder is stopped, pass or fail, the namespace and its mount go with
it. A ballast file fills the disk; a probe agent keeps sending events; the controller
stays up, serves reads, refuses a tenant's declaration with "try later" and
acknowledges nothing it could not store. Once the ballast is gone it writes again, and
after a restart every event the agent was ever acknowledged for is in the store."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import zmq

from harmonaize import messages as m
from harmonaize.opsocket import CommandError
from harmonaize.tenant.client import RequestError
from tests.conftest import Spawn, free_port, needs_root
from tests.controller.test_feed import place
from tests.daemons import Controller, FakeAgent, start_controller, tenant_feed, wait_until
from tests.sse import curl
from tests.tenant.test_http import bearer, token

pytestmark = [pytest.mark.hardening, needs_root]


@dataclass
class SmallDisk:
    """A tmpfs of a few MiB, seen only inside the holder's mount namespace."""

    holder: subprocess.Popen[bytes]
    path: Path

    @property
    def enter(self) -> list[str]:
        return ["nsenter", f"--target={self.holder.pid}", "--mount", "--"]

    def fill(self) -> None:
        """A ballast file that takes every free block (dd ends at ENOSPC)."""
        subprocess.run([*self.enter, "dd", "if=/dev/zero", f"of={self.path / 'ballast'}",
                        "bs=64k"], capture_output=True, timeout=60, check=False)
        out = subprocess.run([*self.enter, "df", "--output=avail", "-B1", str(self.path)],
                             capture_output=True, text=True, timeout=30, check=True)
        assert int(out.stdout.split()[-1]) == 0, "the ballast left room"

    def empty(self) -> None:
        subprocess.run([*self.enter, "rm", "-f", str(self.path / "ballast")], timeout=30,
                       check=True)


@pytest.fixture
def small_disk(spawn: Spawn, workdir: Path) -> Iterator[SmallDisk]:
    path = workdir / "disk"
    path.mkdir()
    holder = spawn(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f"mount -t tmpfs -o size=4m harmonaize-test {path} && echo mounted "
                    "&& exec sleep 3600"], stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline() == b"mounted\n"
    yield SmallDisk(holder, path)
    holder.terminate()  # the mount namespace, and the tmpfs, end with their last process
    holder.wait(timeout=30)



class Agent:
    """A probe agent that keeps every acknowledgement it was given."""

    def __init__(self, ctx: zmq.Context, controller: Controller) -> None:
        self.agent = FakeAgent(ctx, controller)
        assert self.agent.hello() == m.Ack(0)
        self.sent, self.acked = 0, 0

    def event(self, seq: int) -> m.HostEvent:
        return m.HostEvent("disk-test", m.Severity.INFO, f"event {seq} " + "x" * 800)

    def send_new(self) -> None:
        self.sent += 1
        self.agent.send(self.event(self.sent), seq=self.sent)

    def resend_unacked(self) -> None:
        """What a real agent's outbox does: send again what was not acknowledged."""
        for seq in range(self.acked + 1, self.sent + 1):
            self.agent.send(self.event(seq), seq=seq)

    def take_acks(self, wait: float) -> None:
        while self.agent.sock.poll(int(wait * 1000)):
            reply = m.decode(self.agent.sock.recv()).body
            if isinstance(reply, m.Ack):
                self.acked = max(self.acked, reply.seq)
            wait = 0.05


def writing(controller: Controller) -> bool:
    assert controller.proc.poll() is None, controller.log.read_text()[-3000:]
    return controller.request("status").get("storage", {}).get("writing", True)


def test_full_disk_pauses_acknowledgements_keeps_serving_and_resumes_with_nothing_lost(
        spawn, workdir: Path, small_disk: SmallDisk, ctx: zmq.Context) -> None:
    port = free_port()

    def start() -> Controller:
        return start_controller(spawn, workdir, "full_disk_retry = 0.2\n[gateway]\n"
                                f'listen = "127.0.0.1:{port}"\n',
                                database=small_disk.path / "controller.db",
                                wrap=small_disk.enter)

    controller = start()
    place(controller, "job-a", "acme", "h1")
    url, secret = f"http://127.0.0.1:{port}/v1", token(controller, "acme")
    agent = Agent(ctx, controller)
    for _ in range(5):
        agent.send_new()
    agent.take_acks(5.0)
    assert agent.acked == 5
    small_disk.fill()
    # Events until a commit finds no room (SQLite may first reuse its log's free pages).
    while writing(controller):
        assert agent.sent < 2000, "the controller never found the disk full"
        agent.send_new()
        agent.take_acks(0.2)
    acked_when_full = agent.acked
    assert acked_when_full < agent.sent  # the batch that did not fit was not acknowledged
    # Full: the agent sends on and again; nothing is acknowledged, the controller serves.
    for _ in range(5):
        agent.send_new()
    agent.resend_unacked()
    agent.take_acks(1.0)
    assert agent.acked == acked_when_full
    status = controller.request("status")
    assert status["storage"]["writing"] is False and status["storage"]["episodes"] == 1
    assert "no room" in status["storage"]["reason"]
    assert {e["seq"] for e in controller.request("events", {"limit": 10})} <= set(
        range(1, acked_when_full + 1))
    with tenant_feed(controller, ["job/acme/"], context=ctx) as feed:
        with pytest.raises(RequestError) as refused:
            feed.declare(m.JobDeclaration("job-a", revision=1))
        assert refused.value.code == "unavailable" and "try again later" in str(refused.value)
    status, body, _ = curl("POST", f"{url}/declarations", *bearer(secret),
                           body={"job": "job-a", "revision": 1})
    assert status == 503 and body["error"]["code"] == "unavailable"
    status, body, _ = curl("GET", f"{url}/notices", *bearer(secret))
    assert status == 200 and body["notices"] == []
    with pytest.raises(CommandError, match="disk is full"):  # an operator's change too
        place(controller, "job-b", "acme", "h1")
    assert controller.proc.poll() is None

    small_disk.empty()
    wait_until(lambda: writing(controller), what="writing to resume")
    wait_until(lambda: (agent.resend_unacked(), agent.take_acks(0.5),
                        agent.acked == agent.sent)[-1], what="every event acknowledged")
    status, _, _ = curl("POST", f"{url}/declarations", *bearer(secret),
                        body={"job": "job-a", "revision": 1})
    assert status == 200  # tenants' writes are taken again
    for _ in range(3):  # and new ones as ever
        agent.send_new()
    agent.take_acks(5.0)
    assert agent.acked == agent.sent
    controller.proc.send_signal(signal.SIGTERM)
    assert controller.proc.wait(timeout=30) == 0
    log = controller.log.read_text()
    assert log.count("writing paused") == 1 and log.count("has room again") == 1
    assert "Traceback" not in log

    controller = start()  # the same database, on the same small disk
    stored = {e["seq"] for e in controller.request("events", {"limit": 10_000})
              if e["reason"] == "disk-test"}
    assert stored == set(range(1, agent.sent + 1))
    assert controller.request("status")["storage"]["writing"] is True
