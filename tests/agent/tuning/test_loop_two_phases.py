"""The two phases (arm, then outcome) taken communicator by communicator."""

from __future__ import annotations

import dataclasses

import pytest

from agent.tuning.loop import LoopSettings, TuningLoop, WritePolicy, build_policy
from harmonaize.messages import (
    AckPhase,
    Activation,
    JobDeclaration,
    TuningAck,
    TuningArm,
    TuningResolve,
)
from tests.agent.tuning.test_loop import (
    CALM,
    COMM,
    DECLARATION,
    DERIVED,
    FULL,
    JOB,
    Host,
    arm,
    judged,
    multi_host,
    restarted,
)
from tests.agent.tuning.test_loop_edges import (
    A,
    B,
    arm_comms,
    declared,
    resolve_comms,
    two_comm_multi_host,
)

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


# --- the two phases, communicator by communicator ------------------------------------


def test_refusals_say_exactly_why() -> None:
    host = multi_host()
    refused = arm(host, decision=2, fingerprint="other")
    assert refused.reason == ("this host derived other rules from its declaration "
                              f"({DERIVED.fingerprint}, not other)")
    bogus = arm(host, decision=3, choice="bogus")
    assert bogus.reason.startswith("unknown choice 'bogus'")
    ok = arm(host, decision=4)
    assert (ok.phase, ok.reason, ok.decision) == (AckPhase.ARMED, "", 4)


def test_an_arm_for_no_communicator_here_is_armed_with_nothing_to_do() -> None:
    host = multi_host()
    writes = host.writes
    host.sent.clear()
    message = TuningArm(JOB, 1, "severe", DERIVED.fingerprint, (Activation(12345, 2000),))
    host.run(host.loop.arm(message, 1.0), 1.0)
    (ack,) = [m for m in host.sent if isinstance(m, TuningAck)]
    assert (ack.phase, ack.reason) == (AckPhase.ARMED, "")
    assert host.entry() is None and host.writes == writes + 1


def test_an_unknown_jobs_outcome_is_answered_with_its_decision() -> None:
    loop = TuningLoop(LoopSettings())
    (answer,) = loop.resolve(TuningResolve("job-z", 8, False, ()), 0.0)
    assert answer.message.decision == 8 and answer.message.job == "job-z"


def test_an_arm_makes_a_job_multi_host_even_before_its_ranks_say_so() -> None:
    host = declared(2)
    host.advance(500)
    host.step(CALM, 0.0)
    assert not host.job.multi
    assert arm(host).phase is AckPhase.ARMED
    assert host.job.multi  # from now on the controller decides
    host.step(FULL, 1.5)
    assert host.entry().pending and host.job.choice == "default"


def test_an_arm_adds_to_what_a_previous_agent_armed() -> None:
    host = two_comm_multi_host()
    arm_comms(host, 1, {A: 2000})
    host.policy = build_policy([host.entry(A)], 3)  # B had nothing armed
    new = restarted(host, policy=host.policy)
    assert set(new.job.entries) == {A}
    new.loop.refresh(JOB, new.slots(), 10.0)
    ack = arm_comms(new, 1, {A: 2000, B: 2000})
    assert ack.phase is AckPhase.ARMED
    assert new.entry(A).pending and new.entry(B).pending
    assert new.entry(A).decision == new.entry(B).decision == 1


def test_an_outcome_resolves_every_communicator_it_names() -> None:
    host = two_comm_multi_host()
    arm_comms(host, 1, {A: 2000})
    resolve_comms(host, 1, {A: 2000})
    host.advance(2500, comm=A)
    host.step(FULL, 2.5)
    arm_comms(host, 2, {B: 3000})
    assert not host.entry(A).pending and host.entry(B).pending
    resolve_comms(host, 2, {B: 3000}, now=3.0)
    assert host.entry(B).pending is False and host.entry(B).after == "severe"


def test_a_settled_communicator_does_not_block_arming_another() -> None:
    host = two_comm_multi_host()
    arm_comms(host, 1, {A: 2000})
    resolve_comms(host, 1, {A: 2000})
    host.advance(2500, comm=A)  # A's ranks far past its switch
    host.step(FULL, 2.5)
    ack = arm_comms(host, 2, {B: 2000})
    assert (ack.phase, ack.reason) == (AckPhase.ARMED, "")


def test_confirming_goes_through_every_job() -> None:
    quiet = Host()
    quiet.declare(JobDeclaration("job-0", revision=1))  # nothing to tune, stepped first
    host = Host(activation_margin=50)
    host.loop = quiet.loop
    host.declare()
    host.add(1)
    other = Host(activation_margin=50)
    other.loop = quiet.loop
    other.declare(dataclasses.replace(DECLARATION, job="job-2"))
    other.add(1, comm=0xB0B)
    loop = quiet.loop
    loop.step(judged([CALM]), {JOB: host.slots(), "job-2": other.slots()}, 0.0)
    loop.step(judged([FULL]), {JOB: host.slots(), "job-2": other.slots()}, 0.1)
    assert loop.jobs[JOB].arming and loop.jobs["job-2"].arming
    actions = loop.confirm({JOB: host.slots(), "job-2": other.slots()}, 0.1)
    assert {a.job for a in actions if isinstance(a, WritePolicy)} == {JOB, "job-2"}
    assert not loop.jobs[JOB].entries[COMM].pending
    assert not loop.jobs["job-2"].entries[0xB0B].pending


def test_a_job_missing_from_the_records_cancels_what_it_armed() -> None:
    host = declared(1, activation_margin=50)
    host.step(CALM, 0.0)
    host.loop.step(judged([FULL]), {JOB: host.slots()}, 0.1)
    host.loop.confirm({}, 0.1)
    assert host.job.history[-1].reason == f"{COMM:#x}: its ranks are gone"
    assert host.entry().pending is False and host.entry().after == "default"


def test_cancellations_are_listed_and_added_up() -> None:
    host = declared(1, comm=A, activation_margin=50, hold=0.0)
    host.add(1, comm=B)
    host.step(CALM, 0.0)

    def both_gone() -> None:
        host.ranks[A].clear()
        host.ranks[B].clear()

    host.between.append(both_gone)
    host.step(FULL, 0.1)
    cancelled = host.job.history[-1]
    assert cancelled.reason == f"{A:#x}: its ranks are gone; {B:#x}: its ranks are gone"
    assert host.job.aborted == 2
    host.add(1, comm=A)
    host.add(1, comm=B)
    host.between.append(both_gone)
    host.step(FULL, 0.2)
    assert host.job.aborted == 4


def test_a_confirmation_lists_where_each_communicator_switches() -> None:
    host = declared(1, comm=A, activation_margin=50)
    host.add(1, comm=B)
    host.step(CALM, 0.0)
    host.step(FULL, 0.1)
    confirmed = host.job.history[-1]
    assert confirmed.kind == "confirmed" and confirmed.reason == "2 communicator(s)"
    assert confirmed.activations == ((A, host.entry(A).at), (B, host.entry(B).at))
    assert host.entry(A).pending is False
