"""Tuning-loop behaviours a mutation pass found no test pinned."""

from __future__ import annotations

import dataclasses

import pytest

from agent.tuning.loop import (
    CommState,
    LoopSettings,
    TuningLoop,
    WritePolicy,
    build_policy,
    wire_comm,
)
from harmonaize.messages import Activation, Level, TuningArm, TuningResolve
from tests.agent.tuning.test_loop import (
    BUSY,
    CALM,
    COMM,
    DECLARATION,
    DERIVED,
    FILE,
    FULL,
    JOB,
    Host,
    arm,
    judged,
    link,
    multi_host,
    resolve,
    restarted,
)
from tests.agent.tuning.test_loop_edges import SEVERE_RULES, A, B, declared

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


# --- what a second mutation pass found unpinned ----------------------------------------


def test_rules_of_an_older_declaration_are_rebuilt_from_the_old_file_as_previous() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    host.step(FULL, 0.0)
    host.advance(1, comm=A)
    host.advance(1, comm=B)
    # The file is older than the ranks (revision 1), but it still holds the old rules;
    # B's ranks follow rules nobody can name.
    stale = build_policy([dataclasses.replace(host.entry(A), revision=1),
                          dataclasses.replace(host.entry(B), revision=1)], 3)
    rank_b = host.ranks[B][0]
    rank_b.held = dataclasses.replace(rank_b.held, after=4242)
    new = Host()
    new.ranks, new.sizes, new.policy = host.ranks, host.sizes, stale
    other = dataclasses.replace(DECLARATION, revision=2, tuning=(dataclasses.replace(
        DECLARATION.tuning[0], max_channels=12),))  # other rules from now on
    new.loop.declare(other, 10.0)
    new.loop.file(JOB, FILE)
    new.run(new.loop.adopt(JOB, stale, new.slots(), 10.0), 10.0)
    entry = new.entry(A)
    assert (entry.after, entry.after_rules, entry.revision) == ("previous", SEVERE_RULES, 2)
    assert new.entry(B) is None and new.job.orphaned == {B}  # not the file's stale entry
    assert new.job.history[-1].reason == (
        "1 communicator(s) from the previous agent; 1 rebuilt from the ranks' records; "
        "1 left as their ranks hold them")


def test_every_change_a_dead_agent_armed_alone_is_cancelled() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    host.step(CALM, 0.0)
    armed = [host.loop._armed(host.job, host.job.comms[c], 150, DERIVED.get("severe"))
             for c in (A, B)]
    host.policy = build_policy(armed, 5)
    again = restarted(host, policy=host.policy)
    assert again.job.aborted == 2
    assert not again.entry(A).pending and not again.entry(B).pending


def test_two_rebuilt_communicators_are_counted() -> None:
    host = declared(1, comm=A)
    host.add(1, comm=B)
    host.step(FULL, 0.0)
    host.advance(1, comm=A)
    host.advance(1, comm=B)
    again = restarted(host, policy=None)
    assert again.job.history[-1].reason == (
        "2 communicator(s) from the previous agent; 2 rebuilt from the ranks' records")


def test_a_withdrawal_is_recorded() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.run(host.loop.withdraw(JOB, 1.0), 1.0)
    withdrawn = [c for c in host.job.history if c.kind == "withdrawn"]
    assert [(c.before, c.after, c.reason, c.time) for c in withdrawn] == [
        ("severe", "default", "declaration withdrawn", 1.0)]


def test_every_cancel_counts() -> None:
    host = multi_host()
    arm(host, decision=1)
    resolve(host, False, decision=1)
    host.step(FULL, 2.5)
    arm(host, decision=2, at=3000)
    resolve(host, False, decision=2, at=3000)
    assert host.job.aborted == 2


def test_a_rank_that_already_took_the_armed_copy_confirms_it() -> None:
    host = declared(2, activation_margin=50)
    host.step(CALM, 0.0)
    host.between.append(lambda: host.advance(1))  # both take the armed copy, below `at`
    host.step(FULL, 0.1)
    assert host.job.history[-1].kind == "confirmed"
    assert not host.entry().pending


def test_a_stale_refusal_number_without_the_flag_confirms() -> None:
    host = declared(1, activation_margin=50)
    host.step(CALM, 0.0)

    def stale() -> None:
        host.ranks[COMM][0].refused = None  # no refusal flagged ...

    host.between.append(stale)
    original = host.ranks[COMM][0].slot

    def slot(*args, **kwargs):
        return dataclasses.replace(original(*args, **kwargs), refused_revision=9)  # ... a number

    host.ranks[COMM][0].slot = slot  # type: ignore[method-assign]
    host.step(FULL, 0.1)
    assert host.job.history[-1].kind == "confirmed"


def test_a_fall_is_dated_by_its_own_pass_and_a_late_rise_by_its_onset() -> None:
    host = declared(1, hold=0.0, max_changes_per_minute=2)
    host.step(FULL, 0.0)                   # pass 1: severe (rise)
    host.advance(100_000)
    host.step(BUSY, 1.0)
    host.step(BUSY, 1.1)                   # pass 3: congested (fall)
    fall = [c for c in host.job.history if c.kind == "local"][-1]
    assert (fall.after, fall.step, fall.onset_step) == ("congested", 3, 3)
    host.advance(100_000)
    host.step(CALM, 2.0)
    host.step(FULL, 2.1)                   # pass 5: the rise waits for the rate limit
    assert host.job.choice == "congested"
    host.step(FULL, 60.5)                  # pass 6: the change at 0 s no longer counts
    rise = [c for c in host.job.history if c.kind == "local"][-1]
    assert (rise.after, rise.step, rise.onset_step) == ("severe", 6, 5)


def test_an_answer_names_its_job() -> None:
    host = multi_host()
    assert arm(host).job == JOB
    assert resolve(host, True).job == JOB


def test_a_link_skipped_does_not_hide_the_next_one() -> None:
    loop = TuningLoop(LoopSettings())
    down = dataclasses.replace(FULL, name="eth9", up=False)
    storage = link(0.95, name="sda-net", link_class="storage")
    assert loop._links(judged([down, storage, FULL]))[0] is Level.HIGH


def test_shutdown_goes_through_every_job() -> None:
    first = multi_host()
    single = Host()
    single.loop = first.loop
    single.declare(dataclasses.replace(DECLARATION, job="job-s"))
    single.add(1, comm=0xB0B)
    first.loop.step(judged([FULL]), {JOB: first.slots(), "job-s": single.slots()}, 1.0)
    first.loop.confirm({"job-s": single.slots()}, 1.0)
    single.advance(100_000, comm=0xB0B)
    actions = first.loop.shutdown({JOB: first.slots(), "job-s": single.slots()}, 2.0)
    assert [a.job for a in actions if isinstance(a, WritePolicy)] == ["job-s"]


def test_a_multi_host_job_withdrawn_after_another_keeps_the_others_actions() -> None:
    loop = TuningLoop(LoopSettings())
    single, multi = Host(), Host()
    for host, job in ((single, JOB), (multi, "job-m")):
        host.loop = loop
        host.declare(dataclasses.replace(DECLARATION, job=job))
    single.add(1)
    multi.add(2, comm=0xD0D, n_ranks=4, nodes=2)
    multi.advance(500, comm=0xD0D)
    stats = {JOB: single.slots(), "job-m": multi.slots()}
    loop.step(judged([CALM]), stats, 0.0)
    message = TuningArm("job-m", 1, "severe", DERIVED.fingerprint,
                        (Activation(wire_comm(0xD0D), 2000),))
    loop.arm(message, 0.5)
    loop.confirm(stats, 0.5)
    loop.resolve(TuningResolve("job-m", 1, True, message.activations), 0.6)
    loop.withdraw("job-m", 0.7)  # severe agreed: it stays, reporting, until agreed back
    actions = loop.step(judged([FULL]), {JOB: single.slots(), "job-m": multi.slots()}, 1.0)
    assert any(isinstance(a, WritePolicy) and a.job == JOB for a in actions)
    assert "job-m" in loop.jobs


def test_a_communicator_without_live_ranks_is_never_ready() -> None:
    host = Host()
    host.declare()
    assert host.loop._not_ready(host.job, CommState(7), 100) == "no live rank"


def test_an_orphan_says_why_it_waits() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.advance(1)
    rank = host.ranks[COMM][0]
    rank.held = dataclasses.replace(rank.held, after=4242, revision=5)
    again = restarted(host, policy=None)
    again.step(FULL, 11.0)
    assert again.job.waiting == (f"communicator {COMM:#x}: its ranks follow rules this "
                                 "agent could not rebuild")
