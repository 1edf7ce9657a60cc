"""A job on one host: congestion arms, verifies and confirms a switch no rank has reached."""

from __future__ import annotations

import dataclasses

import pytest

from agent.tuning.loop import Retire, build_policy
from harmonaize.messages import JobDeclaration
from tests.agent.tuning.test_loop import (
    BUSY,
    CALM,
    COMM,
    DECLARATION,
    FULL,
    JOB,
    SEVERE,
    Host,
    agree,
    judged,
    race,
)

pytestmark = pytest.mark.tuning


# --- one host ------------------------------------------------------------------------


def test_congestion_arms_verifies_and_confirms_at_a_point_no_rank_reached() -> None:
    host = Host(activation_margin=50)
    host.declare()
    host.add(2)
    host.step(CALM, 0.1)
    host.advance(1000)
    host.step(FULL, 0.2)
    entry = host.entry()
    assert (entry.before, entry.after, entry.pending) == ("default", "severe", False)
    assert entry.at >= 1000 + 50 and entry.revision == 2  # armed at 1, confirmed at 2
    assert [c.kind for c in host.job.history][-2:] == ["local", "confirmed"]
    host.advance(entry.at + 10 - 1000)
    assert [r.last_switch for r in host.ranks[COMM]] == [entry.at, entry.at]
    assert all(r.current == SEVERE for r in host.ranks[COMM])


def test_a_rank_that_raced_past_the_point_unseen_cancels_the_change() -> None:
    host = Host(activation_margin=50)
    host.declare()
    host.add(2)
    host.step(CALM, 0.1)
    host.advance(1000)
    race(host)
    host.step(FULL, 0.2)
    entry = host.entry()
    assert entry.after == entry.before == "default" and not entry.pending
    assert host.job.history[-1].kind == "cancelled"
    host.advance(500)
    assert all(r.current == 0 for r in host.ranks[COMM])  # nobody switched
    assert agree(host)


def test_the_margin_grows_with_the_collective_rate() -> None:
    host = Host(activation_margin=10, activation_lead=0.5)
    host.declare()
    host.add(1)
    for i in range(5):
        host.advance(5000)
        host.step(CALM, i * 1.0)
    host.advance(5000)
    host.step(FULL, 5.0)
    assert host.entry().at >= host.ranks[COMM][0].n + 2500  # 5000/s x 0.5 s


def test_a_fall_waits_for_the_hold_and_a_rise_does_not() -> None:
    host = Host(hold=5.0)
    host.declare()
    host.add(1)
    host.step(FULL, 0.0)
    assert host.job.choice == "severe"
    host.advance(10_000)
    host.step(CALM, 1.0)
    host.step(CALM, 5.5)
    assert host.job.choice == "severe"
    host.step(CALM, 6.1)
    assert host.job.choice == "default"
    host.step(BUSY, 6.2)
    assert host.job.choice == "congested"


def test_flapping_input_changes_the_choice_once_and_the_rate_limit_holds() -> None:
    host = Host(hold=0.0, max_changes_per_minute=2)
    host.declare()
    host.add(1)
    now = 0.0
    for view in [FULL, CALM, FULL, CALM, FULL, CALM, FULL]:
        host.advance(20_000)
        host.step(view, now)
        host.step(view, now + 0.05)
        now += 1.0
    local = [c for c in host.job.history if c.kind == "local"]
    assert len(local) == 2
    assert "rate limit" in host.job.waiting


def test_no_new_switch_until_every_rank_passed_the_last_one() -> None:
    host = Host(hold=0.0, activation_margin=100)
    host.declare()
    host.add(2)
    host.step(FULL, 0.0)
    at = host.entry().at
    host.advance(at + 5, rank=0)  # one rank past the switch, the other not
    host.step(CALM, 1.0)
    host.step(CALM, 1.1)
    assert host.entry().after == "severe"
    assert "has not passed the previous switch" in host.job.waiting
    host.advance(at + 5, rank=1)
    host.step(CALM, 1.2)
    assert host.entry().after == "default"


@pytest.mark.parametrize(("tamper", "why"), [
    (lambda s: dataclasses.replace(s, flags=s.flags | 0x4, wait_at=3), "waits at collective"),
    (lambda s: dataclasses.replace(s, flags=s.flags | 0x8, refused_revision=9), "refused"),
    (lambda s: dataclasses.replace(s, flags=s.flags | 0x10), "defers"),
    (lambda s: dataclasses.replace(s, policy_file=(1, 3)), "does not map the current"),
    (lambda s: dataclasses.replace(s, revision=7), "newer than this agent"),
])
def test_a_rank_in_doubt_blocks_arming(tamper, why) -> None:
    host = Host()
    host.declare()
    host.add(2)
    slots = host.slots()
    slots[1] = tamper(slots[1])
    host.run(host.loop.step(judged([FULL]), {JOB: slots}, 0.0), 0.0)
    assert host.entry() is None
    assert why in host.job.waiting


def test_ranks_the_agent_cannot_see_block_arming() -> None:
    host = Host()
    host.declare()
    host.add(2, n_ranks=3)  # NCCL says 3 ranks, one has no visible stats
    host.step(FULL, 0.0)
    assert host.entry() is None and "2 of its 3 ranks visible" in host.job.waiting
    other = Host()
    other.declare()
    other.add(3, n_ranks=2)  # more slots than ranks: two communicators share an id
    other.step(FULL, 0.0)
    assert other.entry() is None and "ambiguous" in other.job.waiting


def test_a_communicator_created_later_joins_the_choice_in_force() -> None:
    host = Host()
    host.declare()
    host.add(1)
    host.step(FULL, 0.0)
    host.add(2, comm=COMM + 1)
    host.step(FULL, 0.1)
    assert host.entry(COMM + 1).after == "severe"


def test_a_full_policy_never_drops_a_listed_communicator() -> None:
    host = Host()
    host.declare()
    for i in range(33):
        host.add(1, comm=COMM + i)
    host.step(FULL, 0.0)
    assert len(host.job.entries) == 32 and len(host.job.unlisted) == 1
    build_policy(host.job.entries.values(), 1)


def test_entries_outlive_a_missed_listing_but_not_the_stall_time() -> None:
    host = Host(stall=10.0)
    host.declare()
    host.add(1)
    host.step(FULL, 0.0)
    host.run(host.loop.step(judged([FULL]), {JOB: []}, 1.0), 1.0)  # one listing found nothing
    assert host.entry() is not None
    host.run(host.loop.step(judged([FULL]), {JOB: []}, 11.0), 11.0)
    assert host.entry() is None


def test_a_declaration_without_ranges_never_changes_anything() -> None:
    host = Host()
    host.declare(JobDeclaration(JOB, revision=1))
    host.add(1)
    for i in range(5):
        host.step(FULL, i * 1.0)
    assert host.job.entries == {}


def test_an_older_revision_is_refused() -> None:
    host = Host()
    host.declare(dataclasses.replace(DECLARATION, revision=5))
    with pytest.raises(ValueError, match="older"):
        host.loop.declare(dataclasses.replace(DECLARATION, revision=4), 1.0)


def test_withdrawal_returns_to_nccl_first_then_retires() -> None:
    host = Host()
    host.declare()
    host.add(1)
    host.step(FULL, 0.0)
    at = host.entry().at
    host.run(host.loop.withdraw(JOB, 1.0), 1.0)
    assert JOB in host.loop.jobs  # the rank has not passed the severe switch yet
    host.advance(at + 1)
    host.step(FULL, 2.0)
    back = host.entry()
    assert back.after == "default"
    host.advance(back.at + 1 - host.ranks[COMM][0].n)
    host.step(FULL, 3.0)
    assert JOB not in host.loop.jobs
    assert all(r.current == 0 for r in host.ranks[COMM])


def test_a_quiet_job_retires_at_once() -> None:
    host = Host()
    host.declare()
    actions = host.loop.withdraw(JOB, 1.0)
    assert actions == [Retire(JOB)]


def test_shutdown_returns_single_host_communicators_to_nccl() -> None:
    host = Host()
    host.declare()
    host.add(2)
    host.step(FULL, 0.0)
    host.advance(host.entry().at + 1)
    host.run(host.loop.shutdown({JOB: host.slots()}, 1.0), 1.0)
    assert host.entry().after == "default" and not host.entry().pending
