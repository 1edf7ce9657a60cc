"""The traffic-class plan (pure): floors kept, the rest to the collectives, stable ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.tuning.htb import (
    DEFAULT_CLASS,
    DSCP_FLAG,
    MIN_RATE_KBIT,
    ROOT,
    ROOT_CLASS,
    BulkJob,
    assign_minors,
    plan,
)

pytestmark = pytest.mark.tuning


def test_classes_for_two_jobs_on_a_known_link() -> None:
    jobs = [BulkJob("a", 100.0, (9000,)), BulkJob("b", 250.0, (), (10, 12))]
    minors = assign_minors(["a", "b"], {})
    result = plan(jobs, [("eth0", 1000), ("eth1", None)], minors)
    (link,) = result.links
    rates = {c.classid: (c.rate_kbit, c.ceil_kbit, c.prio) for c in link.classes}
    assert rates == {ROOT_CLASS: (1_000_000, 1_000_000, 0),
                     DEFAULT_CLASS: (650_000, 1_000_000, 0),
                     ROOT | minors["a"]: (100_000, 1_000_000, 1),
                     ROOT | minors["b"]: (250_000, 1_000_000, 1)}
    assert result.ports() == {9000: ROOT | minors["a"]}
    assert result.dscp() == {10: ROOT | minors["b"], 12: ROOT | minors["b"]}
    assert {uid for uid, _, _ in result.flows} == {0}  # root's sockets: no group given
    assert any("eth1: link speed unknown" in note for note in result.notes)


@pytest.mark.hardening
def test_item4_a_port_two_jobs_claim_stays_with_the_first_to_declare_it() -> None:
    # Two jobs of one user: not the first by name ("a"), the first declared ("b"), and
    # it keeps it after.
    jobs = [BulkJob("b", 1.0, (9000,), (10,)), BulkJob("a", 1.0, (9000, 9001), (10,))]
    minors = assign_minors(["a", "b"], {})
    result = plan(jobs, [("eth0", 100)], minors)
    assert result.ports() == {9000: ROOT | minors["b"], 9001: ROOT | minors["a"]}
    assert result.dscp() == {10: ROOT | minors["b"]}
    assert "port 9000: job a's claim refused: job b declared it first" in " ".join(
        result.notes)
    # Held across plans, whatever order the jobs come in later.
    again = plan(list(reversed(jobs)), [("eth0", 100)], minors, previous=result)
    assert again.flows == result.flows
    # Once b stops declaring it, the next claimant gets it.
    freed = plan([BulkJob("b", 1.0, ()), jobs[1]], [("eth0", 100)], minors,
                 previous=again)
    assert freed.ports() == {9000: ROOT | minors["a"], 9001: ROOT | minors["a"]}


@pytest.mark.hardening
def test_item4_a_job_classifies_only_its_own_users_sockets() -> None:
    # Tenant users 1001 (the victim's group) and 2002 (the hostile job's): the hostile
    # job names the victim's port and DSCP 0 (everyone's), first.
    hostile = BulkJob("hostile", 10_000_000.0, (5202,), (0,), uids=(2002,))
    victim = BulkJob("victim", 10.0, (5202,), uids=(1001,))
    minors = assign_minors(["victim", "hostile"], {})
    result = plan([hostile, victim], [("eth0", 40)], minors)
    assert set(result.flows) == {(2002, 5202, ROOT | minors["hostile"]),
                                 (2002, DSCP_FLAG | 0, ROOT | minors["hostile"]),
                                 (1001, 5202, ROOT | minors["victim"])}
    assert not any("refused" in note for note in result.notes)  # nobody contends
    # A group unknown on the host: nothing of the job is classified, and it is said.
    unknown = plan([BulkJob("lost", 1.0, (80,), uids=())], [("eth0", 40)],
                   assign_minors(["lost"], {}))
    assert unknown.flows == () and "no user of its group is known here" in unknown.notes[0]


@pytest.mark.hardening
def test_item4_a_huge_floor_leaves_the_others_and_the_collectives_their_guarantees() -> None:
    # The attack: 10 Mb/s declared by one tenant, 10,000,000 Mb/s by another, 40 Mb/s link.
    jobs = [BulkJob("victim", 10.0, (5202,)), BulkJob("hostile", 10_000_000.0, (5203,))]
    minors = assign_minors(["victim", "hostile"], {})
    (link,) = plan(jobs, [("eth0", 40)], minors, collective_share=0.1,
                   max_floor_share=0.5).links
    rates = {c.classid: c.rate_kbit for c in link.classes}
    assert rates[ROOT | minors["victim"]] == 10_000  # as declared
    assert rates[ROOT | minors["hostile"]] == 20_000  # the operator's bound on one job
    assert rates[DEFAULT_CLASS] == 10_000  # above its 10% minimum (4 Mb/s)
    assert sum(rates[c] for c in rates if c != ROOT_CLASS) == 40_000


def test_minors_are_kept_while_a_job_stays() -> None:
    first = assign_minors(["a", "b", "c"], {})
    later = assign_minors(["c", "d"], first)
    assert later["c"] == first["c"] and later["d"] not in (first["c"],)
    assert len(set(later.values())) == 2


def test_no_jobs_no_classes() -> None:
    assert plan([], [("eth0", 100)], {}).links == ()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 1e5), min_size=1, max_size=20), st.integers(1, 400_000),
       st.floats(0.01, 1.0), st.floats(0.01, 1.0))
def test_floors_and_the_collectives_share_always_fit_the_link(floors, speed, share,
                                                              max_share) -> None:
    jobs = [BulkJob(f"j{i}", f, (1000 + i,)) for i, f in enumerate(floors)]
    minors = assign_minors([j.job for j in jobs], {})
    (link,) = plan(jobs, [("eth0", speed)], minors, collective_share=share,
                   max_floor_share=max_share).links
    by_id = {c.classid: c for c in link.classes}
    bulk = [by_id[ROOT | minors[j.job]] for j in jobs]
    link_kbit = speed * 1000
    assert all(c.ceil_kbit == link_kbit for c in link.classes)
    assert all(c.prio == 1 for c in bulk) and by_id[DEFAULT_CLASS].prio == 0
    if not link.scaled:  # every floor as declared
        assert [c.rate_kbit for c in bulk] == [max(MIN_RATE_KBIT, round(f * 1000))
                                               for f in floors]
    else:  # scaled down together, never above what was declared
        assert all(c.rate_kbit <= max(MIN_RATE_KBIT, round(f * 1000))
                   for c, f in zip(bulk, floors, strict=True))
    guaranteed = sum(c.rate_kbit for c in bulk) + by_id[DEFAULT_CLASS].rate_kbit
    floor_sum = sum(c.rate_kbit for c in bulk)
    if floor_sum + MIN_RATE_KBIT <= link_kbit:
        assert guaranteed == link_kbit  # nothing left unassigned, nothing oversold
    # Whatever the others declare, each job keeps its fair share of what bulk may have
    # (within the operator's bound), and the collectives their configured minimum.
    room = max(MIN_RATE_KBIT * len(jobs), int(link_kbit * (1 - share)))
    fair = min(room // len(jobs), max(MIN_RATE_KBIT, int(link_kbit * max_share)))
    for c, f in zip(bulk, floors, strict=True):
        assert c.rate_kbit >= min(max(MIN_RATE_KBIT, round(min(f, speed) * 1000)), fair)
        assert c.rate_kbit <= max(MIN_RATE_KBIT, int(link_kbit * max_share))
    if MIN_RATE_KBIT * len(jobs) <= link_kbit * (1 - share):
        assert by_id[DEFAULT_CLASS].rate_kbit >= int(link_kbit * share)
