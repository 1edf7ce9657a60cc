"""What operators read from the tuning loop, word for word."""

from __future__ import annotations

import dataclasses

import pytest

from agent.tuning.loop import LoopSettings, TuningLoop, wire_comm
from harmonaize.messages import AckPhase, Level, TuningArm, TuningReport
from tests.agent.tuning.test_loop import (
    BUSY,
    CALM,
    COMM,
    DECLARATION,
    DERIVED,
    FULL,
    JOB,
    THRESHOLDS,
    Host,
    arm,
    judged,
    multi_host,
    race,
)
from tests.agent.tuning.test_loop_edges import A, B, declared, disagreeing

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


# --- what operators read, word for word ----------------------------------------------


def blocked(tamper, *, entry_revision: int | None = None, n_ranks: int | None = None,
            count: int = 2) -> str:
    """Why one congested pass arms nothing when ``tamper`` changes the second rank."""
    host = declared(count, n_ranks=n_ranks)
    host.advance(100)
    slots = host.slots()
    slots[-1] = tamper(slots[-1])
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.0), 0.0)
    assert host.entry() is None
    (comm,) = host.job.comms.values()
    assert host.job.waiting == f"communicator {COMM:#x}: {comm.waiting}"
    return comm.waiting


def same(slot):
    return slot


def test_each_reason_not_to_arm_is_named_exactly() -> None:
    assert blocked(lambda s: dataclasses.replace(s, flags=s.flags | 0x4, wait_at=3)) == (
        "a rank waits at collective 3")
    assert blocked(lambda s: dataclasses.replace(s, flags=s.flags | 0x10)) == (
        "a rank defers a copy until it passes its own switch")
    assert blocked(lambda s: dataclasses.replace(s, policy_file=(1, 3))) == (
        "a rank does not map the current policy file yet")
    assert blocked(lambda s: dataclasses.replace(s, revision=1)) == (
        "a rank follows revision 1, newer than this agent's")
    assert blocked(lambda s: dataclasses.replace(s, flags=s.flags | 0x8,
                                                 refused_revision=0)) == (
        "a rank refused revision 0")
    assert blocked(same, n_ranks=3) == "2 of its 3 ranks visible"
    assert blocked(same, n_ranks=2, count=3) == (
        "3 ranks share its id, more than its 2: ambiguous (NCCL before 2.28 gives no "
        "communicator id)")


def test_a_refusal_only_blocks_while_it_is_of_the_newest_revision() -> None:
    host = declared(2, hold=0.0)
    host.step(FULL, 0.0)
    host.advance(100_000)
    revision = host.entry().revision
    slots = host.slots()
    slots[1] = dataclasses.replace(slots[1], flags=slots[1].flags | 0x8,
                                   refused_revision=revision - 1)
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 1.0), 1.0)
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 1.1), 1.1)
    assert host.entry().after == "default"  # an older refusal: the ranks moved on
    unflagged = declared(2, hold=0.0)
    slots = unflagged.slots()
    slots[1] = dataclasses.replace(slots[1], refused_revision=5)  # flag clear: no refusal
    unflagged.run(unflagged.loop.step(judged([FULL]), {JOB: slots}, 0.0), 0.0)
    assert unflagged.entry() is not None


def test_a_rank_on_the_current_revision_does_not_block() -> None:
    host = declared(1, hold=0.0)
    host.step(FULL, 0.0)
    host.advance(100_000)  # the rank follows the confirmed revision, and passed it
    host.step(CALM, 1.0)
    host.step(CALM, 1.1)
    assert host.entry().after == "default" and host.job.waiting == ""


def test_an_unfiled_policy_file_is_not_held_against_the_ranks() -> None:
    loop = TuningLoop(LoopSettings())
    loop.declare(DECLARATION, 0.0)  # the shell never said which file
    host = Host()
    host.loop = loop
    host.add(1)
    loop.step(judged([FULL]), {JOB: host.slots()}, 0.0)
    loop.confirm({JOB: host.slots()}, 0.0)
    assert loop.jobs[JOB].entries[COMM].after == "severe"


def test_a_point_less_than_two_collectives_ahead_is_too_close_to_arm() -> None:
    host = multi_host()  # ranks at 500
    too_close = arm(host, at=501)
    assert too_close.reason == f"{COMM:#x}: a rank reached collective 500 (switch at 501)"
    assert arm(host, decision=2, at=502).phase is AckPhase.ARMED


def test_a_point_less_than_two_collectives_ahead_is_too_close_to_confirm() -> None:
    for lead, ok in [(1, False), (2, True)]:
        host = multi_host()

        def close(h: Host = host, lead: int = lead) -> None:
            for rank in h.ranks[COMM]:
                rank.n = 2000 - lead

        host.between.append(close)
        ack = arm(host)
        assert (ack.phase is AckPhase.ARMED) is ok, lead


def test_a_rank_exactly_at_a_switch_has_not_passed_it() -> None:
    host = declared(1, hold=0.0, activation_margin=100)
    host.step(FULL, 0.0)
    at = host.entry().at
    host.advance(at - host.ranks[COMM][0].n)  # its next collective is the switch
    host.step(FULL, 0.1)
    assert host.ranks[COMM][0].n == at and host.loop.pending_activations(JOB) == 1
    host.advance(1)
    host.step(FULL, 0.2)
    assert host.loop.pending_activations(JOB) == 0


def test_a_local_change_is_this_agents_own_and_a_cancel_is_final() -> None:
    host = declared(2, activation_margin=50)
    host.step(CALM, 0.0)
    host.step(FULL, 0.1)
    assert host.entry().decision == 0 and host.entry().pending is False
    raced = declared(2, activation_margin=50)
    raced.step(CALM, 0.0)
    race(raced)
    raced.step(FULL, 0.1)
    entry = raced.entry()
    assert (entry.pending, entry.revision) == (False, 2)


def test_refusals_are_dated_by_the_jobs_last_pass() -> None:
    host = Host()
    host.declare(now=3.0)
    host.sent.clear()
    host.run(host.loop.arm(TuningArm(JOB, 1, "severe", "other", ()), 9.0), 9.0)
    assert host.job.history[-1].time == 3.0  # no pass yet: its declaration
    host.step(CALM, 4.0)
    host.run(host.loop.arm(TuningArm(JOB, 2, "severe", "other", ()), 9.0), 9.0)
    refusal = host.job.history[-1]
    assert (refusal.kind, refusal.time) == ("refused", 4.0)
    assert refusal.reason.startswith("decision 2: this host derived other rules")


def test_a_fresh_loop_says_there_is_no_congestion() -> None:
    loop = TuningLoop(LoopSettings())
    assert loop.evidence == "no congestion on the job's links" and loop.steps == 0
    loop.step(judged([]), {}, 0.0)
    assert loop.steps == 1


def test_a_link_without_a_known_speed_counts_as_idle() -> None:
    loop = TuningLoop(LoopSettings())
    unknown = dataclasses.replace(FULL, utilization=None, ce_fraction=THRESHOLDS.ce_high)
    level, evidence, _ = loop._links(judged([unknown]))
    assert level is Level.HIGH
    assert evidence == (f"eth0: high: utilization 0%, CE/CNP {THRESHOLDS.ce_high:.2%}, "
                        "retransmits 0.00%")


def test_low_congestion_counts_as_congested_time_and_retransmits_are_remembered() -> None:
    host = declared(1, hold=100.0)
    host.step(CALM, 0.0)
    host.step(BUSY, 1.0)
    host.step(BUSY, 2.0)
    assert host.job.congested == pytest.approx(2.0)  # each span ending congested
    lossy = dataclasses.replace(CALM, retransmit_fraction=THRESHOLDS.retransmit_low,
                                packets_per_s=THRESHOLDS.min_packets_per_s)
    host.step(lossy, 3.0)
    host.step(CALM, 4.0)
    assert host.job.retransmitting is True  # since the job began, not only now


def test_a_job_absent_from_the_records_is_still_stepped() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.run(host.loop.step(judged([FULL]), {}, 1.0), 1.0)
    assert host.job.last_step == 1.0 and host.entry() is not None
    host.run(host.loop.shutdown({}, 2.0), 2.0)


def test_after_a_change_a_quiet_pass_writes_nothing_and_waits_for_nothing() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    writes = host.writes
    host.step(FULL, 0.5)
    assert host.writes == writes and host.job.waiting == ""


def test_one_communicator_not_ready_does_not_hold_back_the_others() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    slots = host.slots()
    slots[0] = dataclasses.replace(slots[0], flags=slots[0].flags | 0x10)  # A defers
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.0), 0.0)
    assert host.entry(A) is None and host.entry(B).after == "severe"
    assert host.job.waiting.startswith(f"communicator {A:#x}: a rank defers")


def test_a_communicator_without_ranks_this_pass_does_not_hold_back_the_others() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    host.step(CALM, 0.0)
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(B)}, 0.1), 0.1)
    assert host.entry(A) is None and host.entry(B).after == "severe"


def test_communicators_still_listed_are_kept_when_another_is_forgotten() -> None:
    host = declared(1, comm=A, stall=5.0)
    host.add(1, comm=B)
    host.step(FULL, 6.0)
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(A)}, 7.0), 7.0)
    assert set(host.job.comms) == {A, B}  # seen at 6 s: 1 s is not the stall time
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(A)}, 11.0), 11.0)
    assert set(host.job.comms) == {A} and set(host.job.entries) == {A}


def test_a_report_is_capped_to_what_the_wire_carries() -> None:
    host = multi_host()
    huge = 2**63
    slots = [dataclasses.replace(s, collectives=huge, last_switch=huge - 1) for s in host.slots()]
    host.job.entries[COMM] = dataclasses.replace(
        host.loop._armed(host.job, host.job.comms[COMM], huge, DERIVED.get("severe")))
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.5), 0.5)
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 5.0), 5.0)
    reports = [m for m in host.sent if isinstance(m, TuningReport)]
    comm = reports[-1].comms[0]
    assert reports[-1].job == JOB
    assert (comm.collectives_min, comm.collectives_max, comm.at) == (2**62, 2**62, 2**62)
    assert comm.per_second == 1e9
    assert (comm.ahead.last_switch, comm.ahead.collectives) == (2**62, 2**62)
    assert (comm.behind.last_switch, comm.behind.collectives) == (2**62, 2**62)


def test_reports_list_communicators_by_id_and_skip_those_without_ranks() -> None:
    host = Host(report_interval=1.0)
    host.declare()
    for comm in (9, 3, 7):
        host.add(1, comm=comm, n_ranks=2, nodes=2)
    host.step(FULL, 0.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert [c.comm for c in report.comms] == [3, 7, 9]
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: host.slots(9)}, 2.0), 2.0)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert [c.comm for c in report.comms] == [9]


def test_a_report_says_when_the_ranks_here_disagree() -> None:
    host = multi_host()
    slots = disagreeing(host)
    host.sent.clear()
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.5), 0.5)
    (report,) = [m for m in host.sent if isinstance(m, TuningReport)]
    assert report.comms[0].diverged is True


def test_an_armed_answer_carries_the_ranks_state() -> None:
    host = multi_host()
    ack = arm(host)
    (comm,) = ack.comms
    assert (comm.comm, comm.pending, comm.at) == (wire_comm(COMM), True, 2000)
