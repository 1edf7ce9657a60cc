"""The agreement says paused only when ranks can be waiting: an unreachable or silent host."""

from __future__ import annotations

import pytest

from controller.core import ControllerCore
from controller.outputs import AgentPeer, Output, SendToAgent
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.messages import TuningStatus
from tests.controller.test_agreement import JOB, agreement, comm, kinds, report
from tests.controller.test_core_with_outbox import WALL, agent_frame, config, hello

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


# --- issue 28, item 15: `paused` only when ranks can be waiting ---------------------------


def test_item15_no_change_is_armed_while_a_host_of_the_job_is_unreachable() -> None:
    a = agreement(report_ttl=10.0)
    a.report("h1", report(2, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1000)), 1.0)
    # h2's report is fresh, but h2 has gone quiet: an arm would reach nobody there.
    assert a.step(1.0, reachable={"h1"}) == []
    assert a.status(JOB, 1.0)["waiting"] == "host h2 is unreachable"
    assert a.health(JOB, 9.0) == ("default", TuningStatus.STEADY)  # long past the lead
    # Reachable again: the change goes to both, as before.
    assert kinds(a.step(9.5, reachable={"h1", "h2"})) == [("h1", "tuning-arm"),
                                                          ("h2", "tuning-arm")]


def test_item15_a_host_silent_before_the_change_leaves_the_tenant_told_steady() -> None:
    """The campaign's schedule through the controller's core: two hosts, h2 silent from
    0.5 s (its report fresh for 10 s more), h1 congested from 3 s, when h2 has missed two
    heartbeats but is not yet counted down (3.5 s); no rank ever waits, so the job must
    never read as paused, and the change goes out once h2 is back."""
    core = ControllerCore(config(liveness={"missed_heartbeats": 3}), 0.0)
    core.place(Placement(JOB, "acme", (Member("0", "h1"), Member("1", "h2"))), 0.0, WALL)
    peers = {h: AgentPeer(h.encode(), h) for h in ("h1", "h2")}
    seqs = {"h1": 0, "h2": 0}

    def send(host: str, body: m.Message, now: float) -> list[Output]:
        seqs[host] += 1
        return core.receive(peers[host], agent_frame(body, seqs[host], now, sender=host), now)

    def wish(severity: int, n: int) -> m.TuningReport:
        return report(severity, comm(n))

    for host in ("h1", "h2"):
        core.receive(peers[host], agent_frame(hello(heartbeat=1.0), sender=host), 0.0)
    send("h1", wish(0, 1000), 0.5)
    send("h2", wish(0, 1000), 0.5)  # h2's last word before it falls silent
    arms: list[tuple[float, bytes]] = []
    statuses = set()
    t = 1.0
    while t <= 30.0:
        out = send("h1", wish(2 if t >= 3.0 else 0, 1000 + int(t * 100)), t)
        out += core.tick(t, WALL)
        arms += [(t, o.conn) for o in out
                 if isinstance(o, SendToAgent) and isinstance(o.message, m.TuningArm)]
        statuses.add(core.agreement.health(JOB, t)[1])
        t = round(t + 0.5, 3)
    assert arms == [] and statuses == {TuningStatus.STEADY}
    assert "unreachable" in core.agreement.status(JOB, t)["waiting"] \
        or "no recent report" in core.agreement.status(JOB, t)["waiting"]
    # h2 is back: the change is armed on both hosts.
    core.receive(peers["h2"], agent_frame(hello(heartbeat=1.0), sender="h2"), t)
    send("h2", wish(0, 4000), t)
    send("h1", wish(2, 4000), t)
    out = core.tick(t, WALL)
    assert sorted(o.conn for o in out if isinstance(o, SendToAgent)
                  and isinstance(o.message, m.TuningArm)) == [b"h1", b"h2"]
