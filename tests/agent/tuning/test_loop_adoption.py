"""A restarted agent adopts what the policy file and the ranks say, rule by rule."""

from __future__ import annotations

import dataclasses

import pytest

from agent.tuning.loop import LoopSettings, TuningLoop, WritePolicy, build_policy
from harmonaize.messages import Level
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
    multi_host,
    restarted,
)
from tests.agent.tuning.test_loop_edges import CONGESTED_RULES, SEVERE_RULES, declared

pytestmark = [pytest.mark.tuning, pytest.mark.hardening]


# --- a restarted agent ---------------------------------------------------------------


def test_adoption_is_recorded_with_what_was_rebuilt_and_left() -> None:
    host = declared(2)
    host.step(FULL, 0.0)
    host.advance(1)
    again = restarted(host, policy=host.policy)
    adopted = again.job.history[-1]
    assert (adopted.kind, adopted.before, adopted.after, adopted.reason) == (
        "adopted", "severe", "severe", "1 communicator(s) from the previous agent")
    assert again.job.level.level is Level.HIGH  # the choice's level: no step down at once
    rebuilt = restarted(host, policy=None)
    assert rebuilt.job.history[-1].reason == (
        "1 communicator(s) from the previous agent; 1 rebuilt from the ranks' records")
    assert rebuilt.job.choice == "severe"


def test_adopting_a_congested_policy_takes_its_level() -> None:
    host = declared(1)
    host.step(BUSY, 0.0)
    host.advance(1)
    again = restarted(host, policy=host.policy)
    assert again.job.choice == "congested" and again.job.level.level is Level.LOW
    assert again.job.desired_severity == 1


def test_adopting_mixed_choices_keeps_the_declared_default() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.add(1, comm=COMM + 1)  # joins later: armed with severe too ...
    host.advance(1, comm=COMM)
    entries = dict(host.job.entries)
    entries[COMM + 1] = dataclasses.replace(entries[COMM], comm_id=COMM + 1, after="congested",
                                            after_rules=CONGESTED_RULES)
    policy = build_policy(entries.values(), 7)  # ... but this one follows another choice
    again = restarted(host, policy=policy)
    assert again.job.choice == "default" and again.job.level.level is Level.NONE
    assert {e.after for e in again.job.entries.values()} == {"severe", "congested"}


def test_ranks_newer_than_the_file_win_and_ranks_with_nothing_are_skipped() -> None:
    host = declared(2)
    host.step(FULL, 0.0)
    host.advance(1)
    stale = build_policy([dataclasses.replace(host.entry(), revision=1, after="default",
                                              after_rules=(), pending=False)], 3)
    host.add(1, comm=COMM + 1)  # a communicator whose rank follows nothing yet
    again = restarted(host, policy=stale)
    entry = again.entry()
    assert (entry.after, entry.revision) == ("severe", 2)  # what the ranks hold
    assert again.entry(COMM + 1) is None
    assert "1 rebuilt from the ranks' records" in again.job.history[-1].reason


def test_a_file_newer_than_the_ranks_is_kept() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    newer = build_policy([dataclasses.replace(host.entry(), revision=9)], 4)
    again = restarted(host, policy=newer)
    assert again.entry().revision == 9
    assert "rebuilt" not in again.job.history[-1].reason


def test_an_orphan_is_named_and_forgotten_with_its_communicator() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.advance(1)
    new = Host(stall=5.0)
    new.ranks, new.sizes, new.policy = host.ranks, host.sizes, host.policy
    other = dataclasses.replace(DECLARATION, revision=2, tuning=(dataclasses.replace(
        DECLARATION.tuning[0], max_channels=12),))
    new.loop.declare(other, 10.0)
    new.loop.file(JOB, FILE)
    new.run(new.loop.adopt(JOB, None, new.slots(), 10.0), 10.0)
    assert new.job.history[-1].reason == (
        "0 communicator(s) from the previous agent; 1 left as their ranks hold them")
    new.run(new.loop.step(judged([FULL]), {JOB: []}, 11.0), 11.0)
    assert COMM in new.job.orphaned
    new.run(new.loop.step(judged([FULL]), {JOB: []}, 16.0), 16.0)
    assert COMM not in new.job.orphaned and COMM not in new.job.comms


def test_a_pending_change_of_a_communicator_with_no_visible_rank_is_kept() -> None:
    """Nobody on this host can say its ranks are local only: leave it for whoever can."""
    host = declared(1)
    host.step(CALM, 0.0)
    armed = host.loop._armed(host.job, host.job.comms[COMM], 150, DERIVED.get("severe"))
    policy = build_policy([armed], 5)
    new = Host()
    new.loop.declare(DECLARATION, 10.0)
    new.run(new.loop.adopt(JOB, policy, [], 10.0), 10.0)
    assert new.entry().pending and new.job.aborted == 0


def test_a_cancelled_adopted_change_counts_as_aborted() -> None:
    host = declared(2)
    host.step(CALM, 0.0)
    armed = host.loop._armed(host.job, host.job.comms[COMM], 150, DERIVED.get("severe"))
    host.policy = build_policy([armed], 5)
    for rank in host.ranks[COMM]:
        rank.see(host.policy.view(COMM))
    again = restarted(host, policy=host.policy)
    assert again.job.aborted == 1
    entry = again.entry()
    assert (entry.revision, entry.after_rules) == (armed.revision + 1, ())


# --- adoption, rule by rule ----------------------------------------------------------


def test_an_adopted_entry_keeps_both_sides_of_its_switch() -> None:
    host = declared(1, hold=0.0)
    host.step(FULL, 0.0)
    host.advance(100_000)
    host.step(BUSY, 1.0)
    host.step(BUSY, 1.1)  # severe -> congested
    host.advance(1)  # the rank took it
    held = host.entry()
    assert (held.before, held.after) == ("severe", "congested")
    for policy in (host.policy, None):
        again = restarted(host, policy=policy)
        entry = again.entry()
        assert (entry.before, entry.after) == ("severe", "congested"), policy
        assert (entry.before_rules, entry.after_rules) == (SEVERE_RULES, CONGESTED_RULES)
        assert (entry.at, entry.revision, entry.pending) == (held.at, held.revision, False)
        assert again.job.history[-1].time == 10.0


def test_after_adoption_nothing_is_written_until_something_changes() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.advance(1)
    loop = TuningLoop(LoopSettings())
    loop.declare(DECLARATION, 10.0)
    actions = loop.adopt(JOB, host.policy, host.slots(), 10.0)
    assert actions == [WritePolicy(JOB, tuple(loop.jobs[JOB].entries.values()))]
    assert loop.step(judged([FULL]), {JOB: host.slots()}, 11.0) == []


def test_adopting_what_the_ranks_follow_when_nccl_was_restored() -> None:
    host = declared(1)
    host.step(FULL, 0.0)
    host.advance(host.entry().at + 1)
    host.run(host.loop.shutdown({JOB: host.slots()}, 1.0), 1.0)  # back to NCCL's choice
    host.advance(1)
    again = restarted(host, policy=None)
    assert again.job.choice == "default" and again.job.level.level is Level.NONE
    assert again.entry().after == "default"


def test_adoption_goes_through_every_communicator() -> None:
    """One skipped communicator (nothing held, newer in the file, or its rules unknown)
    must not stop the others being adopted."""
    host = declared(1, comm=1)
    host.add(1, comm=2)
    host.add(1, comm=3)
    host.step(FULL, 0.0)
    host.advance(1, comm=1)
    host.advance(1, comm=2)
    host.advance(1, comm=3)
    host.add(1, comm=0)  # follows nothing
    host.ranks[2][0].held = dataclasses.replace(host.ranks[2][0].held, after=12345)  # unknown
    newer = dict(host.job.entries)
    newer[3] = dataclasses.replace(newer[3], revision=8)
    stale = build_policy([newer[3]], 4)  # lists only 3, newer than its rank
    order = [0, 2, 3, 1]
    host.ranks = {c: host.ranks[c] for c in order}
    again = restarted(host, policy=stale)
    assert again.job.orphaned == {2}
    assert set(again.job.entries) == {1, 3}
    assert again.entry(3).revision == 8 and again.entry(1).after == "severe"


def test_a_pending_change_rebuilt_from_the_ranks_stays_pending_for_the_controller() -> None:
    host = multi_host()
    arm(host)
    host.advance(1)
    again = restarted(host, policy=None)
    entry = again.entry()
    assert (entry.at, entry.revision, entry.pending, entry.after) == (2000, 1, True, "severe")
    assert again.job.aborted == 0
