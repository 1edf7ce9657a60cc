"""The core's acknowledgements and answers wait for the commit of what they cover."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.core import ControllerCore
from controller.outputs import (
    AgentPeer,
    AnswerTenant,
    BadFrame,
    Commit,
    Output,
    SendToAgent,
    TenantPeer,
)
from controller.types import Member, Placement
from harmonaize import messages as m
from tests.controller.test_core_with_outbox import (
    HOST,
    JOB,
    SUMMARY,
    TENANT,
    WALL,
    agent_frame,
    config,
    hello,
    tenant_frame,
)

pytestmark = pytest.mark.redesign


def commits(outputs: list[Output]) -> list[Commit]:
    return [out for out in outputs if isinstance(out, Commit)]


def test_acknowledgements_wait_for_the_commit_of_what_they_cover(tmp_path: Path) -> None:
    core = ControllerCore(config(), 0.0)
    core.tick(0.0, WALL)
    peer = AgentPeer(b"c1", HOST)
    assert core.receive(peer, agent_frame(hello(), now=1.0), 1.0) == []
    assert core.receive(peer, agent_frame(m.HostEvent("X", m.Severity.INFO), 1, 1.0),
                        1.0) == []
    assert core.next_deadline() == 1.0  # held: due now
    out = core.tick(1.0, WALL + 1.0)
    assert isinstance(out[0], Commit)
    assert [e.seq for e in out[0].writes.events] == [1]
    assert [o.message for o in out[1:] if isinstance(o, SendToAgent)] == [m.Ack(0), m.Ack(1)]
    # A duplicate is answered with what is stored, also after the commit.
    core.receive(peer, agent_frame(m.HostEvent("X", m.Severity.INFO), 1, 1.5), 1.5)
    assert [o.message for o in core.tick(1.5, WALL) if isinstance(o, SendToAgent)] == [
        m.Ack(1)]
    # An unknown connection is told at once: that depends on nothing stored.
    (resync,) = core.receive(AgentPeer(b"c2", HOST), agent_frame(SUMMARY, 2, 2.0), 2.0)
    assert isinstance(resync, SendToAgent) and isinstance(resync.message, m.Resync)


def test_a_declaration_is_answered_after_it_is_stored_and_forwarded(tmp_path: Path) -> None:
    core = ControllerCore(config(), 0.0)
    core.place(Placement(JOB, TENANT, (Member("0", HOST),), group="ml"), 0.0, WALL)
    core.receive(AgentPeer(b"c1", HOST), agent_frame(hello()), 0.0)
    core.tick(0.0, WALL)
    declaration = m.JobDeclaration(JOB, revision=2)
    out = core.receive(TenantPeer(b"t1", TENANT), tenant_frame(declaration, seq=5), 0.1)
    assert isinstance(out[0], Commit)
    assert out[0].writes.declarations == {JOB: (TENANT, declaration)}
    # The host gets the placement's group, never the tenant's word for it.
    assert out[1] == SendToAgent(b"c1", m.JobDeclaration(JOB, revision=2, group="ml"))
    assert out[2] == AnswerTenant(b"t1", m.Reply(5, True, ""))
    # Another tenant's request for the job: refused, nothing stored or forwarded.
    (refused,) = core.receive(TenantPeer(b"t2", "beta"), tenant_frame(declaration), 0.2)
    assert isinstance(refused, AnswerTenant) and not refused.message.ok  # type: ignore[attr-defined]
    assert refused.message.code == "not-placed"  # type: ignore[attr-defined]
    # Bad input: one answer for a request that named its number, none for bad framing.
    (bad,) = core.receive(TenantPeer(b"t1", TENANT), BadFrame("invalid", "no", 9), 0.3)
    assert bad == AnswerTenant(b"t1", m.Reply(9, False, "rejected: no", "invalid"))
    assert core.receive(TenantPeer(b"t1", TENANT), BadFrame("framing", "3 frames"), 0.3) == []
    assert core.feed.stats["bad_request"] == 2
