"""A restarted agent takes up the policy it finds: adopted as it was, rebuilt or cancelled."""

from __future__ import annotations

import dataclasses

import pytest

from agent.tuning.loop import build_policy
from tests.agent.tuning.test_loop import (
    COMM,
    DECLARATION,
    DERIVED,
    FILE,
    FULL,
    JOB,
    SEVERE,
    Host,
    _comm,
    agree,
    restarted,
)

pytestmark = pytest.mark.tuning


# --- a restarted agent ---------------------------------------------------------------


def test_adopting_the_policy_keeps_it_as_it_was() -> None:
    host = Host()
    host.declare()
    host.add(2)
    host.step(FULL, 0.0)
    before = host.entry()
    again = restarted(host, policy=host.policy)
    assert again.entry().after == "severe" and again.entry().revision == before.revision
    assert again.job.choice == "severe"
    again.advance(before.at + 10)
    assert agree(again) and all(r.current == SEVERE for r in again.ranks[COMM])


def test_an_unreadable_policy_is_rebuilt_from_what_the_ranks_follow() -> None:
    host = Host()
    host.declare()
    host.add(2)
    host.step(FULL, 0.0)
    host.advance(1)  # the ranks took the policy
    before = host.entry()
    again = restarted(host, policy=None)
    entry = again.entry()
    assert (entry.at, entry.after, entry.revision) == (before.at, "severe", before.revision)
    # What it writes is taken by the ranks: nothing refused, nothing switches.
    assert not any(s.refused for s in again.slots())


def test_rules_no_choice_has_are_left_as_the_ranks_hold_them() -> None:
    host = Host()
    host.declare()
    host.add(1)
    host.step(FULL, 0.0)
    host.advance(1)
    new = Host()
    new.ranks, new.sizes, new.policy = host.ranks, host.sizes, host.policy
    other = dataclasses.replace(DECLARATION, revision=2, tuning=(dataclasses.replace(
        DECLARATION.tuning[0], max_channels=12),))  # caps 6 and 3: no 4 of the old
    new.loop.declare(other, 10.0)
    new.loop.file(JOB, FILE)
    new.run(new.loop.adopt(JOB, None, new.slots(), 10.0), 10.0)
    assert COMM in new.job.orphaned and new.entry() is None
    new.step(FULL, 11.0)
    assert "could not rebuild" in new.job.waiting


def test_a_single_host_change_armed_by_a_dead_agent_is_cancelled() -> None:
    host = Host()
    host.declare()
    host.add(2)
    host.advance(100)
    # The previous agent died between arming and confirming.
    entry = host.loop._armed(host.job, host.job.comms.get(COMM) or _comm(host), 150,
                             DERIVED.get("severe"))
    host.policy = build_policy([entry], 5)
    for rank in host.ranks[COMM]:
        rank.see(host.policy.view(COMM))
    host.advance(60)
    assert all(r.n == 150 and r.would_wait() for r in host.ranks[COMM])  # they wait
    again = restarted(host, policy=host.policy)
    assert again.entry().after == "default" and not again.entry().pending
    again.advance(10)
    assert all(r.n == 160 and r.current == 0 for r in again.ranks[COMM])
