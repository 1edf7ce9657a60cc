"""When and where the agreement switches: its point, the hold, the rate limit, each communicator."""

from __future__ import annotations

import dataclasses

import pytest

from harmonaize.messages import TuningReport, TuningStatus
from tests.controller.test_agreement import COMM, FP, JOB, agreement, arm_of, comm, report
from tests.controller.test_agreement_rules import committed_once

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


def test_the_switching_point_is_past_every_hosts_projected_position() -> None:
    a = agreement(lead=1.0, margin=100)
    a.report("h1", report(2, comm(1000, rate=100.0)), 0.5)  # half a second old at 1.0: 1050
    a.report("h2", report(0, comm(1200, rate=300.0)), 1.0)  # the furthest, and the fastest
    (activation,) = arm_of(a.step(1.0)).activations
    assert activation.at == 1200 + 300  # its position + the fastest rate x the lead (> margin)
    b = agreement(lead=0.1, margin=100)
    b.report("h1", report(2, comm(1000, rate=100.0)), 0.0)
    b.report("h2", report(0, comm(1200, rate=100.0)), 0.0)
    (slow,) = arm_of(b.step(2.0)).activations
    assert slow.at == 1200 + 200 + 100  # projected 2 s on at 100/s, then the margin


def test_a_step_down_waits_exactly_the_hold_and_takes_the_highest_wish_meanwhile() -> None:
    a = agreement(hold=10.0)
    committed_once(a)
    at = a.status(JOB, 1.3)["committed"][f"{COMM:#x}"]["at"]
    past = dict(choice="severe", at=at)

    def wish(now: float, h1: int, h2: int = 0) -> list:
        a.report("h1", report(h1, comm(at + 500, **past)), now)
        a.report("h2", report(h2, comm(at + 700, **past)), now)
        return a.step(now)

    assert wish(2.0, 0) == []  # the fall starts being held
    assert wish(5.0, 1) == []  # a milder wish than before, but not the mildest
    assert wish(11.9, 0) == []
    out = wish(12.0, 0)
    assert arm_of(out).choice == "congested"  # the highest wish seen while held


def test_changes_are_limited_to_so_many_a_minute_to_the_second() -> None:
    a = agreement(hold=0.0, max_decisions_per_minute=1)
    committed_once(a)  # one change, at 1.0
    at = a.status(JOB, 1.3)["committed"][f"{COMM:#x}"]["at"]

    def fall(now: float) -> list:
        a.report("h1", report(0, comm(at + 500, choice="severe", at=at)), now)
        a.report("h2", report(0, comm(at + 700, choice="severe", at=at)), now)
        # The first step notes the fall (a hold of 0 still needs one look), the next decides.
        return a.step(now) + a.step(now)

    assert fall(30.0) == []
    assert a.status(JOB, 30.0)["waiting"] == "default waits: 1 changes in the last minute"
    assert fall(60.9) == []
    assert arm_of(fall(61.0)).choice == "default"


def test_a_report_counts_until_exactly_its_ttl() -> None:
    a = agreement(report_ttl=10.0)
    a.report("h1", report(2, comm(1000)), 0.0)
    a.report("h2", report(0, comm(1200)), 0.0)
    assert arm_of(a.step(10.0)).choice == "severe"
    b = agreement(report_ttl=10.0)
    b.report("h1", report(2, comm(1000)), 0.0)
    b.report("h2", report(0, comm(1200)), 0.0)
    assert b.step(10.01) == []


def test_a_host_that_saw_its_own_ranks_disagree_marks_the_job_until_the_comm_is_gone() -> None:
    a = agreement()
    a.report("h1", report(0, dataclasses.replace(comm(1000), diverged=True)), 1.0)
    a.report("h2", report(0, comm(1200)), 1.0)
    a.step(1.0)
    assert a.health(JOB, 1.0) == ("default", TuningStatus.DIVERGED)
    assert a.status(JOB, 1.0)["diverged"] == {f"{COMM:#x}": "host h1 saw its own ranks disagree"}
    a.report("h1", report(0, comm(1000, comm_id=8)), 2.0)
    a.report("h2", report(0, comm(1200, comm_id=8)), 2.0)
    a.step(2.0)
    assert a.health(JOB, 2.0) == ("default", TuningStatus.STEADY)


def test_withdrawing_a_job_at_nccls_choices_sends_nothing_and_forgets_it() -> None:
    a = agreement()
    a.report("h1", report(0, comm(1000)), 1.0)
    a.report("h2", report(0, comm(1200)), 1.0)
    assert a.step(1.0) == []
    a.withdraw(JOB)
    assert a.step(1.1) == []
    assert a.snapshot(JOB) is None and a.take_dirty()[1] == [JOB]


def test_at_most_32_communicators_change_at_once() -> None:
    a = agreement()
    many = [comm(1000, comm_id=100 + i) for i in range(40)]
    a.report("h1", report(2, *many), 1.0)
    a.report("h2", report(0, *many), 1.0)
    arm = arm_of(a.step(1.0))
    assert [x.comm for x in arm.activations] == [100 + i for i in range(32)]


def test_each_communicator_is_judged_on_its_own() -> None:
    a = agreement()
    views = {"h1": [comm(1000, comm_id=1, choice="severe"), comm(1000, comm_id=2,
                                                                 choice="congested"),
                    comm(1000, comm_id=3)],
             "h2": [comm(1200, comm_id=1, choice="severe"), comm(1200, comm_id=2),
                    comm(1200, comm_id=3)]}
    a.report("h1", report(2, *views["h1"]), 1.0)
    a.report("h2", report(0, *views["h2"]), 1.0)
    arm = arm_of(a.step(1.0))
    # 1 is already there, 2 is not ready (its hosts disagree), 3 changes.
    assert [x.comm for x in arm.activations] == [3]
    assert a.status(JOB, 1.0)["waiting"] == (
        "communicator 0x2: hosts follow different rules for it (congested, default)")


def test_a_rank_exactly_at_the_previous_switch_has_not_passed_it() -> None:
    a = agreement()
    a.report("h1", report(2, comm(1000, choice="congested", at=1000)), 1.0)
    a.report("h2", report(0, comm(1200, choice="congested", at=1000)), 1.0)
    assert a.step(1.0) == []
    assert "has not passed the switch at 1000" in a.status(JOB, 1.0)["waiting"]


def test_without_communicators_the_choice_is_simply_recorded() -> None:
    a = agreement()
    a.report("h1", report(2), 1.0)
    a.report("h2", report(0), 1.0)
    assert a.step(1.0) == []
    status = a.status(JOB, 1.0)
    assert (status["choice"], status["severity"], status["phase"]) == ("severe", 2, "idle")


def test_a_wish_that_names_no_declared_choice_is_refused() -> None:
    """The choice in force reaches the tenant: it must be the controller's own name."""
    a = agreement()
    assert a.report("h1", TuningReport(JOB, FP, "h2.internal", 2, (comm(1000),)), 1.0) is False
    assert a.report("h1", TuningReport(JOB, FP, "congested", 2, (comm(1000),)), 1.0) is False
    assert a.report("h2", TuningReport(JOB, FP, "default", 0, (comm(1200),)), 1.0) is True
    assert a.step(1.0) == []  # h1 said nothing usable: no change
    assert a.counters["refused_reports"] == 2
    assert a.health(JOB, 1.0) == ("default", TuningStatus.STEADY)
