"""Several jobs and communicators that come and go: one never holds back another."""

from __future__ import annotations

import dataclasses

import pytest

from agent.plugin.layout import MAX_COMMS
from agent.tuning.loop import Publish, Retire, WritePolicy
from harmonaize.messages import TuningReport
from tests.agent.tuning.test_loop import (
    CALM,
    COMM,
    DECLARATION,
    FULL,
    JOB,
    Host,
    arm,
    judged,
    multi_host,
    resolve,
)
from tests.agent.tuning.test_loop_edges import declared, disagreeing

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


# --- several jobs, communicators that come and go -------------------------------------


def two_jobs() -> tuple[Host, Host]:
    first = declared(1, hold=0.0)
    second = Host(hold=0.0)
    second.loop = first.loop
    second.declare(dataclasses.replace(DECLARATION, job="job-2"))
    second.add(1, comm=0xB0B)
    return first, second


def test_a_retiring_job_does_not_stop_the_others_being_stepped() -> None:
    first, second = two_jobs()
    loop = first.loop
    first.run(loop.step(judged([FULL]), {JOB: first.slots(), "job-2": second.slots()}, 0.0), 0.0)
    assert first.entry() is not None
    loop.withdraw(JOB, 0.5)
    first.advance(100_000)
    actions = loop.step(judged([FULL]), {JOB: first.slots(), "job-2": second.slots()}, 1.0)
    assert {a.job for a in actions if isinstance(a, WritePolicy)} == {JOB, "job-2"}
    assert loop.jobs["job-2"].choice == "severe"


def test_a_multi_host_job_does_not_stop_the_others_being_stepped() -> None:
    first = multi_host()
    other = Host()
    other.loop = first.loop
    other.declare(dataclasses.replace(DECLARATION, job="job-3"))
    other.add(1, comm=0xC0C)
    loop = first.loop
    actions = loop.step(judged([FULL]), {JOB: first.slots(), "job-3": other.slots()}, 2.0)
    assert any(isinstance(a, Publish) and isinstance(a.message, TuningReport)
               for a in actions)
    assert any(isinstance(a, WritePolicy) and a.job == "job-3" for a in actions)
    arm(first)
    resolve(first, True)
    loop.withdraw(JOB, 2.5)  # severe in force: it stays until the way back is agreed
    loop.step(judged([FULL]), {JOB: first.slots(), "job-3": other.slots()}, 3.0)
    assert JOB in loop.jobs
    actions = loop.step(judged([FULL]), {"job-3": other.slots()}, 4.0)  # job-1's ranks left
    assert Retire(JOB) in actions and JOB not in loop.jobs
    assert loop.jobs["job-3"].last_step == 4.0


def test_a_communicator_gone_for_the_stall_time_is_forgotten_entirely() -> None:
    host = declared(1, stall=2.0)
    for i in range(MAX_COMMS):
        host.add(1, comm=COMM + 1 + i)
    host.step(FULL, 0.0)
    assert COMM + MAX_COMMS in host.job.unlisted
    host.run(host.loop.step(judged([FULL]), {JOB: []}, 1.9), 1.9)
    assert len(host.job.entries) == MAX_COMMS
    actions = host.loop.step(judged([FULL]), {JOB: []}, 2.0)
    assert actions == [WritePolicy(JOB, ())]  # the entries went: the file says so
    assert host.job.comms == {} and host.job.unlisted == set()


def test_a_communicator_forgotten_before_its_arm_was_checked_is_not_checked() -> None:
    """The shell may fail to write an armed policy; if the communicator is then
    forgotten, the next check must not look for it."""
    host = declared(1, stall=1.0, activation_margin=50)
    host.step(CALM, 0.0)
    host.loop.step(judged([FULL]), {JOB: host.slots()}, 0.1)  # armed; never written nor checked
    assert host.job.arming
    host.loop.step(judged([FULL]), {JOB: []}, 1.1)
    assert host.job.arming == {} and host.job.entries == {}
    assert host.loop.confirm({JOB: []}, 1.2) == []


def test_a_communicator_seen_on_several_nodes_makes_the_job_multi_host() -> None:
    host = declared(1)
    host.step(CALM, 0.0)
    assert not host.job.multi
    host.add(1, comm=COMM + 1, n_ranks=2, nodes=2)
    host.step(CALM, 1.0)
    assert host.job.multi
    assert host.job.reason.startswith("communicator spans hosts")


def test_local_disagreement_names_the_communicator() -> None:
    host = declared(2)
    slots = disagreeing(host)
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 0.0), 0.0)
    (diverged,) = host.job.diverged
    assert diverged.startswith(f"{COMM:#x}: ")
    event = host.job.history[-1]
    assert event.reason.startswith(f"communicator {COMM:#x}: ")
    host.run(host.loop.step(judged([CALM]), {JOB: slots}, 0.1), 0.1)
    assert [c.kind for c in host.job.history].count("diverged") == 1  # once, as it began
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.2), 0.2)
    assert host.entry() is None and "its ranks disagree" in host.job.waiting


def test_the_collective_rate_is_the_fastest_of_recent_passes() -> None:
    host = declared(1, activation_margin=1, activation_lead=0.5)
    host.step(CALM, 0.0)
    host.advance(3000)
    host.step(CALM, 1.0)   # 3000/s
    host.advance(1000)
    host.step(CALM, 2.0)   # 1000/s
    host.step(CALM, 2.0)   # no time passed: no rate
    comm = host.job.comms[COMM]
    assert list(comm.rates) == [3000.0, 1000.0] and comm.rate == 3000.0
    assert host.loop._margin(comm) == 1500  # 3000/s for half a second
    host.step(FULL, 3.0)   # 0/s
    assert host.entry().at == 4000 + 1500
    for i in range(8):
        host.step(FULL, 4.0 + i)
    assert comm.rate == 0.0 and host.loop._margin(comm) == 1  # the window forgot
