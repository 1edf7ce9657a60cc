"""A job on several hosts: arms, outcomes, reports and retirement as each host sees them."""

from __future__ import annotations

import dataclasses

import pytest

from agent.plugin.layout import MAX_COMMS
from agent.tuning.loop import Retire, wire_comm
from harmonaize.messages import (
    AckPhase,
    Activation,
    TuningAck,
    TuningArm,
    TuningReport,
    TuningResolve,
)
from tests.agent.tuning.test_loop import (
    CALM,
    COMM,
    DERIVED,
    FULL,
    JOB,
    Host,
    arm,
    judged,
    multi_host,
    resolve,
    restarted,
)
from tests.agent.tuning.test_loop_edges import declared

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


# --- several hosts -------------------------------------------------------------------


def test_an_arm_is_recorded_with_its_decision_and_points() -> None:
    host = multi_host()
    arm(host, decision=4)
    armed = [c for c in host.job.history if c.kind == "armed"][-1]
    assert (armed.before, armed.after, armed.reason, armed.activations) == (
        "default", "severe", "decision 4", ((wire_comm(COMM), 2000),))
    entry = host.entry()
    assert (entry.decision, entry.before, entry.after, entry.revision) == (4, "default",
                                                                          "severe", 1)


def test_an_arm_while_another_decision_is_pending_is_refused() -> None:
    host = multi_host()
    arm(host, decision=1)
    refused = arm(host, decision=2, at=2500)
    assert refused.phase is AckPhase.REFUSED
    assert refused.reason == f"communicator {COMM:#x} has a change pending"
    assert host.entry().decision == 1 and host.entry().at == 2000
    refusal = host.job.history[-1]
    assert (refusal.kind, refusal.reason) == (
        "refused", f"decision 2: communicator {COMM:#x} has a change pending")


def test_an_outcome_for_another_decision_leaves_the_pending_change() -> None:
    host = multi_host()
    arm(host, decision=3)
    writes = host.writes
    ack = resolve(host, True, decision=4)
    assert ack.phase is AckPhase.RESOLVED
    assert host.entry().pending and host.writes == writes  # nothing of its own to write
    assert host.job.choice == "default"


def test_an_agreed_change_is_counted_and_explained() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    assert host.job.reason == "agreed with the job's other hosts (decision 1)"
    assert list(host.job.changes) == [2.0]
    confirmed = host.job.history[-1]
    assert (confirmed.kind, confirmed.before, confirmed.after, confirmed.reason) == (
        "confirmed", "default", "severe", "decision 1")
    assert host.entry().revision == 2
    # Confirming the choice already in force is no change.
    host.advance(2500)
    host.step(FULL, 2.5)
    arm(host, decision=2, at=4000)
    resolve(host, True, decision=2, at=4000)
    assert list(host.job.changes) == [2.0]


def test_a_cancelled_change_is_counted_as_aborted() -> None:
    host = multi_host()
    arm(host)
    ack = resolve(host, False)
    assert host.job.aborted == 1 and host.job.choice == "default"
    cancelled = host.job.history[-1]
    assert (cancelled.kind, cancelled.before, cancelled.after) == ("cancelled", "default",
                                                                  "default")
    entry = host.entry()
    assert (entry.pending, entry.after_rules, entry.revision) == (False, (), 2)
    assert ack.reason == "" and ack.decision == 1


def test_an_outcome_older_than_the_last_answer_is_ignored() -> None:
    host = multi_host()
    arm(host, decision=5)
    host.sent.clear()
    old = TuningResolve(JOB, 4, True, (Activation(wire_comm(COMM), 2000),))
    assert host.loop.resolve(old, 2.0) == []
    assert host.entry().pending


def test_a_repeated_arm_after_its_outcome_gets_the_outcome() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    again = arm(host)
    assert (again.phase, again.reason, again.decision) == (AckPhase.RESOLVED, "repeated", 1)


def test_an_adopted_pending_change_is_armed_by_its_point_not_its_decision() -> None:
    host = multi_host()
    arm(host, decision=6)
    again = restarted(host, policy=host.policy)
    assert again.entry().decision == 0 and again.entry().pending
    # The same decision armed again with its point is taken as already armed (the
    # service reads the ranks' records before it judges an arm).
    again.loop.refresh(JOB, again.slots(), 11.0)
    again.sent.clear()
    message = TuningArm(JOB, 6, "severe", DERIVED.fingerprint,
                        (Activation(wire_comm(COMM), 2000),))
    again.run(again.loop.arm(message, 11.0), 11.0)
    (ack,) = [m for m in again.sent if isinstance(m, TuningAck)]
    assert ack.phase is AckPhase.ARMED and again.entry().decision == 6
    # An outcome naming another switching point is not this entry's.
    other = restarted(host, policy=host.policy)
    wrong = TuningResolve(JOB, 6, True, (Activation(wire_comm(COMM), 2001),))
    other.run(other.loop.resolve(wrong, 11.0), 11.0)
    assert other.entry().pending


def test_a_multi_host_arm_is_checked_against_the_ranks_once_written() -> None:
    cases = {
        "its ranks are gone": lambda h: h.ranks.clear(),
        "a rank does not map the current policy file": lambda h: h.loop.file(JOB, (9, 9)),
        "a rank reached collective 1999 (switch at 2000)":
            lambda h: [r.__setattr__("n", 1999) for r in h.ranks[COMM]],
    }
    for why, tamper in cases.items():
        host = multi_host()
        host.between.append(lambda h=host, t=tamper: t(h))
        ack = arm(host)
        assert ack.phase is AckPhase.REFUSED, why
        assert ack.reason == f"{COMM:#x}: {why}"
        assert host.job.acking == 0


def test_a_single_host_arm_is_checked_against_every_rank_once_written() -> None:
    def hide_one(host: Host) -> None:
        host.ranks[COMM].pop()

    def newer(host: Host) -> None:
        for rank in host.ranks[COMM]:
            rank.held = dataclasses.replace(rank.held, revision=9)

    for tamper, why in [(hide_one, "1 of its 2 ranks visible"),
                        (newer, "a rank follows revision 9, newer than this agent's")]:
        host = Host(activation_margin=50)
        host.declare()
        host.add(2)
        host.step(CALM, 0.0)
        host.between.append(lambda h=host, t=tamper: t(h))
        host.step(FULL, 0.1)
        cancelled = host.job.history[-1]
        assert (cancelled.kind, cancelled.reason) == ("cancelled", f"{COMM:#x}: {why}")
        assert host.job.aborted == 1


def test_a_refusal_of_the_armed_revision_cancels_it() -> None:
    host = declared(1, activation_margin=50)
    host.step(CALM, 0.0)

    def refuse() -> None:
        rank = host.ranks[COMM][0]
        rank.unseen, rank.refused = None, host.entry().revision

    host.between.append(refuse)
    host.step(FULL, 0.1)
    assert host.job.history[-1].reason == f"{COMM:#x}: a rank refused revision 1"


def test_a_host_of_a_multi_host_job_says_what_it_waits_for() -> None:
    host = multi_host()
    assert host.job.reason == ("communicator spans hosts: changes are agreed through the "
                               "controller")
    assert host.job.waiting == ("wants severe: waiting for the controller to agree it with "
                                "the other hosts")
    arm(host)
    resolve(host, True)
    host.step(FULL, 2.5)
    assert host.job.waiting == ""


def test_reports_are_sent_on_change_and_at_the_interval_not_on_progress() -> None:
    host = multi_host()  # reported at 0.0
    host.sent.clear()
    host.advance(100)  # progress alone is no news
    host.step(FULL, 0.9)
    assert host.sent == []
    host.step(FULL, 1.0)  # the interval, exactly
    assert len(host.sent) == 1
    host.sent.clear()
    host.step(CALM, 1.1)  # held high: the same wish
    assert host.sent == []
    host.add(1, comm=COMM + 1, n_ranks=2, nodes=2)
    host.step(CALM, 1.2)  # another communicator: news at once
    (report,) = host.sent
    assert [c.comm for c in report.comms] == [wire_comm(COMM), wire_comm(COMM + 1)]


def test_a_report_names_each_communicator_with_ranks_here_once() -> None:
    host = Host(report_interval=1.0)
    host.declare()
    for i in range(MAX_COMMS + 2):
        host.add(1, comm=i + 1, n_ranks=2, nodes=2)
    host.step(FULL, 0.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert [c.comm for c in report.comms] == list(range(1, MAX_COMMS + 1))
    assert all(c.choice == "default" and c.at == 0 and not c.pending for c in report.comms)
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(1)}, 2.0), 2.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert [c.comm for c in report.comms] == [1]  # the others have no rank this pass


def test_a_report_counts_waiting_and_refusing_ranks() -> None:
    host = multi_host()
    slots = host.slots()
    slots[0] = dataclasses.replace(slots[0], flags=slots[0].flags | 0x4, wait_at=9)
    slots[1] = dataclasses.replace(slots[1], flags=slots[1].flags | 0x8, refused_revision=3)
    host.sent.clear()
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 5.0), 5.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    (comm,) = report.comms
    assert (comm.waiting, comm.refused) == (1, 1)


def test_an_answer_carries_a_bounded_reason() -> None:
    host = multi_host()
    long = "x" * 3000
    ack = host.loop._ack(host.job, 7, AckPhase.REFUSED, long).message
    assert ack.reason == "x" * 1000 and host.job.acked == (7, AckPhase.REFUSED)
    host.loop._ack(host.job, 2, AckPhase.RESOLVED, "")
    assert host.job.acked == (7, AckPhase.RESOLVED)  # the newest decision is kept
    stranger = host.loop._ack("job-9", 1, AckPhase.REFUSED, long).message
    assert stranger.reason == "x" * 1000 and stranger.comms == ()


def test_a_withdrawn_multi_host_job_retires_once_its_ranks_follow_nccl() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    host.advance(2500)
    host.step(FULL, 2.5)
    host.run(host.loop.withdraw(JOB, 3.0), 3.0)
    assert JOB in host.loop.jobs  # severe in force: the controller agrees the way back
    assert host.job.waiting == ("withdrawn: returning to NCCL's choices before removing the "
                                "policy")
    host.step(FULL, 3.5)
    assert JOB in host.loop.jobs and host.entry().after == "severe"  # never alone
    arm(host, decision=2, at=4000, choice="default")
    resolve(host, True, decision=2, at=4000)
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots()}, 5.0), 5.0)
    assert JOB not in host.loop.jobs


def test_a_withdrawn_multi_host_job_with_no_ranks_left_retires() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    host.run(host.loop.withdraw(JOB, 3.0), 3.0)
    actions = host.loop.step(judged([FULL]), {JOB: []}, 4.0)
    assert Retire(JOB) in actions


def test_shutdown_leaves_multi_host_jobs_as_agreed() -> None:
    host = multi_host()
    arm(host)
    resolve(host, True)
    writes = host.writes
    host.run(host.loop.shutdown({JOB: host.slots()}, 3.0), 3.0)
    assert host.writes == writes and host.entry().after == "severe"
    assert host.job.choice == "severe"


def test_shutdown_writes_only_where_something_was_armed() -> None:
    host = declared(1)
    host.step(CALM, 0.0)
    assert host.loop.shutdown({JOB: host.slots()}, 1.0) == []


def test_pending_activations_count_armed_and_unpassed_switches() -> None:
    host = declared(2, hold=0.0, activation_margin=100)
    host.step(CALM, 0.0)
    assert host.loop.pending_activations(JOB) == 0
    host.step(FULL, 0.1)
    at = host.entry().at
    assert host.loop.pending_activations(JOB) == 1  # confirmed, not yet passed
    host.advance(at + 1, rank=0)
    host.step(FULL, 0.2)
    assert host.loop.pending_activations(JOB) == 1  # one rank still before it
    host.advance(at + 1, rank=1)
    host.step(FULL, 0.3)
    assert host.loop.pending_activations(JOB) == 0
    multi = multi_host()
    arm(multi)
    assert multi.loop.pending_activations(JOB) == 1  # armed, not resolved
