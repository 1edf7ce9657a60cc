"""A job's energy section: validated with the field named, carried to the job's hosts
with the rest of its declaration, withdrawn like the rest."""

from __future__ import annotations

import pytest

from agent.declarations import Declarations
from controller.config import ControllerConfig
from controller.core import ControllerCore
from controller.outputs import AgentPeer, AnswerTenant, SendToAgent, TenantPeer
from controller.types import Member, Placement
from harmonaize import messages as m
from harmonaize.config import parse
from harmonaize.messages import (
    CONTROLLER_KINDS,
    TENANT_KINDS,
    EnergyAllowance,
    JobDeclaration,
    decode,
    encode,
)
from harmonaize.schema import SchemaError, from_plain, strict_keys

pytestmark = pytest.mark.energy

WALL = 1_700_000_000.0


def parsed(plain: object) -> JobDeclaration:
    with strict_keys():
        return from_plain(JobDeclaration, plain, "declaration")


@pytest.mark.parametrize(("energy", "error"), [
    ({"max_slowdown": 0.9}, "declaration.energy.max_slowdown: 0.9 is above the maximum 0.5"),
    ({"max_slowdown": -0.01}, "declaration.energy.max_slowdown: -0.01 is below the minimum"),
    ({"max_slowdown": "5%"}, "declaration.energy.max_slowdown"),
    ({"min_watts": -1}, "declaration.energy.min_watts: -1.0 is below the minimum"),
    ({"max_slowdwn": 0.05}, "declaration.energy.max_slowdwn: unknown key"),
    ("fast", "declaration.energy: expected a map"),
])
def test_a_bad_energy_section_is_refused_with_the_field_named(energy: object,
                                                              error: str) -> None:
    with pytest.raises(SchemaError, match="^" + error.replace(".", r"\.")):
        parsed({"job": "job-7", "energy": energy})


def test_the_section_defaults_to_no_slack_and_no_floor() -> None:
    assert parsed({"job": "j"}).energy is None
    assert parsed({"job": "j", "energy": {}}).energy == EnergyAllowance(0.0, 0.0)
    assert parsed({"job": "j", "energy": {"max_slowdown": 0.05, "min_watts": 300}}).energy == \
        EnergyAllowance(0.05, 300.0)


def test_it_crosses_the_wire_from_tenant_to_controller_to_host() -> None:
    declaration = JobDeclaration("job-7", revision=2, energy=EnergyAllowance(0.1, 250.0))
    for allowed in (TENANT_KINDS, CONTROLLER_KINDS):
        frame = encode(declaration, sender="acme", seq=1, now=WALL)
        assert decode(frame, allowed=allowed, strict=True).body == declaration


def test_the_agent_keeps_the_newest_and_forgets_a_withdrawn_one() -> None:
    held = Declarations()
    held.receive(JobDeclaration("j", revision=2, energy=EnergyAllowance(0.05)))
    held.receive(JobDeclaration("j", revision=1, energy=EnergyAllowance(0.2)))  # older
    assert held.jobs["j"].energy == EnergyAllowance(0.05)
    held.receive(JobDeclaration("j", revision=3))  # a new revision without energy
    assert held.jobs["j"].energy is None
    held.receive(JobDeclaration("j", revision=4, energy=EnergyAllowance(0.05)))
    held.receive(JobDeclaration("j", withdrawn=True))
    assert "j" not in held.jobs


def test_the_controller_forwards_it_to_the_jobs_hosts_and_forwards_the_withdrawal() -> None:
    cfg = parse(ControllerConfig, {"redaction": {"min_hosts": 1, "min_interval": 0,
                                                 "jitter": 0}})
    core = ControllerCore(cfg, 0.0)
    hello = m.Hello(pool="p", gpu_class="H200", gpus=8, version="t", epoch=1, acked=0,
                    heartbeat=60.0)
    core.receive(AgentPeer(b"c1", "h1"),
                 decode(encode(hello, sender="h1", seq=0, now=WALL)), 0.0)
    core.tick(0.0, WALL)
    core.place(Placement("job-7", "acme", (Member("0", "h1"),), group="acme-7"), 0.0, WALL)

    def declare(body: JobDeclaration, seq: int) -> list[object]:
        envelope = decode(encode(body, sender="acme", seq=seq, now=WALL),
                          allowed=TENANT_KINDS, strict=True)
        return core.receive(TenantPeer(b"t1", "acme"), envelope, 1.0)

    out = declare(JobDeclaration("job-7", revision=1, energy=EnergyAllowance(0.05, 300.0)), 1)
    (answer,) = [o for o in out if isinstance(o, AnswerTenant)]
    assert answer.message.ok
    (sent,) = [o for o in out if isinstance(o, SendToAgent)]
    assert sent.conn == b"c1" and sent.message.energy == EnergyAllowance(0.05, 300.0)
    assert sent.message.group == "acme-7"  # the placement's, never the tenant's
    out = declare(JobDeclaration("job-7", revision=2, withdrawn=True), 2)
    (sent,) = [o for o in out if isinstance(o, SendToAgent)]
    assert sent.message.withdrawn and sent.message.energy is None
