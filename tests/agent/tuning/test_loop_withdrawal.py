"""A withdrawn job, step by step, until it retires."""

from __future__ import annotations

import dataclasses

import pytest

from agent.tuning.loop import LoopSettings, Publish, Retire, TuningLoop, WritePolicy
from tests.agent.tuning.test_loop import (
    CALM,
    COMM,
    DECLARATION,
    DERIVED,
    FULL,
    JOB,
    Host,
    judged,
    multi_host,
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


# --- a withdrawn job, step by step ---------------------------------------------------


def test_a_withdrawn_job_waits_for_its_way_back_to_be_passed() -> None:
    host = declared(1, activation_margin=100)
    host.step(FULL, 0.0)
    host.advance(host.entry().at + 1)
    host.step(FULL, 0.5)
    host.run(host.loop.withdraw(JOB, 1.0), 1.0)
    back = host.entry()
    assert back.after == "default" and not back.pending
    host.step(FULL, 2.0)
    assert JOB in host.loop.jobs  # the way back is not passed yet
    host.advance(back.at - host.ranks[COMM][0].n)
    host.step(FULL, 3.0)
    assert JOB in host.loop.jobs  # at the switch, not past it
    host.advance(1)
    host.step(FULL, 4.0)
    assert JOB not in host.loop.jobs


def test_a_withdrawn_job_with_a_change_pending_waits_for_it() -> None:
    host = declared(1)
    host.step(CALM, 0.0)
    host.job.entries[COMM] = host.loop._armed(host.job, host.job.comms[COMM], 5000,
                                              DERIVED.get("default"))
    actions = host.loop.withdraw(JOB, 1.0)
    assert Retire(JOB) not in actions and JOB in host.loop.jobs


def test_a_withdrawn_multi_host_job_without_entries_retires_at_once() -> None:
    host = multi_host()
    assert host.loop.withdraw(JOB, 1.0) == [Retire(JOB)]


def test_a_withdrawn_multi_host_job_writes_what_it_forgot() -> None:
    host = two_comm_multi_host()
    arm_comms(host, 1, {A: 2000, B: 2000})
    resolve_comms(host, 1, {A: 2000, B: 2000})
    host.advance(2500, comm=A)
    host.advance(2500, comm=B)
    host.step(FULL, 2.5)
    host.run(host.loop.withdraw(JOB, 3.0), 3.0)
    host.loop.step(judged([FULL]), {JOB: host.slots(A)}, 3.5)
    actions = host.loop.step(judged([FULL]), {JOB: host.slots(A)}, 14.0)  # B forgotten
    (write,) = [a for a in actions if isinstance(a, WritePolicy)]
    assert [e.comm_id for e in write.entries] == [A]
    assert JOB in host.loop.jobs


def test_jobs_after_a_retiring_or_multi_host_one_keep_their_actions() -> None:
    loop = TuningLoop(LoopSettings(report_interval=0.05))
    first, multi, leaving = Host(), Host(), Host()
    for host, job in ((first, JOB), (multi, "job-m"), (leaving, "job-q")):
        host.loop = loop
        host.declare(dataclasses.replace(DECLARATION, job=job))
    first.add(1)
    multi.add(1, comm=0xD0D, n_ranks=2, nodes=2)
    leaving.add(1, comm=0xE0E)

    def stats() -> dict[str, list]:
        return {JOB: first.slots(), "job-m": multi.slots(), "job-q": leaving.slots()}

    leaving.run(loop.step(judged([FULL]), stats(), 0.0), 0.0)  # job-q takes severe
    leaving.advance(100_000, comm=0xE0E)
    leaving.run(loop.step(judged([FULL]), stats(), 0.1), 0.1)
    leaving.run(loop.withdraw("job-q", 0.2), 0.2)  # and arms its way back
    leaving.advance(1_000_000, comm=0xE0E)  # past the way back (a fast communicator)
    first.advance(100_000)
    actions = loop.step(judged([FULL]), stats(), 0.3)  # job-q passed its way back
    assert any(isinstance(a, WritePolicy) and a.job == JOB for a in actions)
    assert any(isinstance(a, Publish) and a.message.job == "job-m" for a in actions)
    assert Retire("job-q") in actions
