"""The feed across resets, resumes and retention: nothing acknowledged is lost
silently, nothing is delivered twice or out of order."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest
import zmq

from harmonaize import messages as m
from tests.conftest import needs_root, python
from tests.controller.test_feed import FAST_RENEW, Sender, advice, drain, place
from tests.daemons import Controller, FakeAgent, start_controller, tenant_feed

pytestmark = [pytest.mark.hardening, pytest.mark.controller, needs_root]


def ports_of(controller: Controller) -> tuple[int, int]:
    return (int(controller.listen.rsplit(":", 1)[1]), int(controller.feed.rsplit(":", 1)[1]))


def damage(db: Path, content: bytes) -> None:
    for suffix in ("-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    db.write_bytes(content)


def test_an_empty_or_corrupt_database_stops_the_start_in_one_line(
    spawn, workdir: Path
) -> None:
    controller = start_controller(spawn, workdir)
    controller.proc.send_signal(signal.SIGTERM)
    controller.proc.wait(timeout=30)
    db = workdir / "controller.db"
    for content, why in ((b"", "the database file is empty (0 bytes)"),
                         (b"SQLite format 3\0" + b"\x5a" * 4000, "not a usable database")):
        damage(db, content)
        refused = subprocess.run(python("controller.main", "-c", str(controller.config)),
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode != 0
        (line,) = refused.stderr.strip().splitlines()
        assert line.startswith(f"harmonaize-controller: controller.database: {db}: {why}"), line
        assert "--initialise" in line
        assert db.read_bytes() == content  # left for the operator to look at
    damage(db, b"")
    start_controller(spawn, workdir, ports=ports_of(controller), args=["--initialise"])
    (aside,) = workdir.glob("controller.db.broken-*")
    assert aside.stat().st_size == 0
    assert "beginning a new database" in controller.log.read_text()


def test_a_tenant_that_stayed_connected_gets_everything_after_a_database_reset(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir, extra=FAST_RENEW)
    place(controller, "job-a", "alpha", *["h1"] * 40)
    sender = Sender(FakeAgent(ctx, controller))
    with tenant_feed(controller, ["job/alpha/"], "alpha", gap_timeout=5) as feed:
        assert feed.recv(timeout=10) is not None  # job health: subscribed
        for i in range(24):
            sender.send(advice("job-a", i))
        assert len(drain(feed, 24, m.JobAdvisory)) == 24
        before = feed.epoch
        controller.proc.send_signal(signal.SIGKILL)
        controller.proc.wait(timeout=10)
        damage(workdir / "controller.db", b"")  # then the operator says: begin anew
        controller = start_controller(spawn, workdir, extra=FAST_RENEW,
                                      ports=ports_of(controller), args=["--initialise"])
        place(controller, "job-a", "alpha", *["h1"] * 40)
        sender.reconnect()
        for i in range(24, 34):
            sender.send(advice("job-a", i))
        got = drain(feed, 10, m.JobAdvisory, timeout=30)
        assert [int(a.ranks[0]) for a in got] == list(range(24, 34))
        assert feed.stats.resets == 1 and feed.epoch not in (0, before)


def test_a_resumed_watcher_gets_no_older_condition_after_a_newer_event(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir, extra="[feed]\nrepublish = 0.5\n")
    place(controller, "job-a", "alpha", "h1", "h1")
    sender = Sender(FakeAgent(ctx, controller))
    sender.send(m.HostSummary(m.Health.DEGRADED, True, m.GpuCounts(healthy=8)))
    with tenant_feed(controller, ["job/alpha/"], "alpha") as feed:
        health = drain(feed, 1, m.JobHealth)
        assert health and health[0].degraded == ("0", "1")
        sender.send(advice("job-a", 0))
        sender.send(advice("job-a", 1))
        assert len(drain(feed, 2, m.JobAdvisory)) == 2
        positions, epoch = feed.positions, feed.epoch
    with tenant_feed(controller, ["job/alpha/"], "alpha", resume=positions,
                     epoch=epoch) as back:
        # Several republications of the job-health condition (older than both advisories).
        assert back.recv(timeout=3.0) is None
        assert back.stats.repeated_conditions >= 2
        sender.send(advice("job-a", 1))
        (later,) = drain(back, 1, m.Message)
        assert isinstance(later, m.JobAdvisory)


def test_retention_bounds_what_is_kept_and_replayed(
    spawn, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir, extra="[feed]\nretention = 3\n")
    place(controller, "job-a", "alpha", *["h1"] * 12)
    sender = Sender(FakeAgent(ctx, controller))
    with tenant_feed(controller, ["job/alpha/"], "alpha") as feed:
        assert feed.recv(timeout=10) is not None
        positions, epoch = feed.positions, feed.epoch
    for i in range(10):  # while the tenant is away
        sender.send(advice("job-a", i))
    with tenant_feed(controller, ["job/alpha/"], "alpha", resume=positions, epoch=epoch,
                     gap_timeout=1.0) as back:
        got = drain(back, 10, m.JobAdvisory, timeout=4.0)
        assert [a.ranks[0] for a in got] == ["7", "8", "9"]
        assert back.stats.gaps == 1  # and the loss is said, not hidden
