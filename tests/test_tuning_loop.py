"""The sans-I/O tuning loop: hysteresis, rate limit, activation points, agreement."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.config import LinksSection
from agent.linkhealth import LinkView
from agent.tuning.loop import (
    Entry,
    LoopSettings,
    Propose,
    Retire,
    TuningLoop,
    WritePolicy,
    build_policy,
    wire_comm,
)
from agent.tuning.policies import derive
from agent.tuning.shm import StatsSlot
from controller.agreement import Agreement, AgreementSettings
from harmonaize.messages import (
    Activation,
    Algorithm,
    Collective,
    JobDeclaration,
    Protocol,
    TuningDecision,
    TuningRange,
)
from tests.test_tuning_policies import declarations

pytestmark = pytest.mark.tuning

JOB = "job-1"
COMM = 0xC0FFEE00DEADBEEF  # bit 63 set, as NCCL's random ids may have
THRESHOLDS = LinksSection()
DECLARATION = JobDeclaration(JOB, tuning=(TuningRange(
    (Collective.ALLREDUCE,), (Algorithm.RING, Algorithm.TREE), (Protocol.LL, Protocol.SIMPLE),
    0, 1 << 40, 2, 16),), revision=1)


def link(utilization: float, name: str = "eth0", link_class: str = "data") -> LinkView:
    return LinkView(name, link_class, True, utilization, 0.0, 0.0, 0.0, 1e5)


CALM, BUSY, FULL = link(0.1), link(0.7), link(0.95)


def slots(*counts: int, comm: int = COMM, nodes: int = 1) -> list[StatsSlot]:
    """One slot per local rank (pid), each at its own collective count."""
    return [StatsSlot(100 + i, comm, 8, nodes, count, 0, 0) for i, count in enumerate(counts)]


def new_loop(**overrides) -> TuningLoop:
    return TuningLoop(LoopSettings(**overrides), THRESHOLDS)


def writes(actions) -> list[WritePolicy]:
    return [a for a in actions if isinstance(a, WritePolicy)]


def entry(actions, comm: int = COMM) -> Entry:
    (write,) = writes(actions)
    return next(e for e in write.entries if e.comm_id == comm)


# --- one host ------------------------------------------------------------------------


def test_congestion_switches_in_the_same_pass_at_a_point_no_rank_reached() -> None:
    loop = new_loop(activation_margin=50)
    assert writes(loop.declare(DECLARATION, 0.0))
    assert loop.step([CALM], {JOB: slots(1000, 998)}, 0.1) == []
    actions = loop.step([FULL], {JOB: slots(1010, 1012)}, 0.2)
    switched = entry(actions)
    assert (switched.before, switched.after) == ("default", "severe")
    assert switched.at >= 1012 + 50
    assert switched.after_rules == derive(DECLARATION).get("severe").rules
    job = loop.jobs[JOB]
    assert job.choice == "severe" and "eth0: high: utilization 95%" in job.reason
    change = job.history[-1]
    assert change.kind == "local" and change.step - change.onset_step == 0


def test_the_margin_grows_with_the_collective_rate() -> None:
    loop = new_loop(activation_margin=10, activation_lead=0.5)
    loop.declare(DECLARATION, 0.0)
    loop.step([CALM], {JOB: slots(0)}, 1.0)
    loop.step([CALM], {JOB: slots(1000)}, 2.0)  # 1000 collectives per second
    switched = entry(loop.step([FULL], {JOB: slots(2000)}, 3.0))
    assert switched.at >= 2000 + 500


def test_a_fall_waits_for_the_hold_and_a_rise_does_not() -> None:
    loop = new_loop(hold=5.0)
    loop.declare(DECLARATION, 0.0)
    loop.step([FULL], {JOB: slots(10)}, 1.0)
    assert loop.jobs[JOB].choice == "severe"
    for t in range(2, 6):  # calm, but for less than the hold
        loop.step([CALM], {JOB: slots(10_000 * t)}, float(t))
        assert loop.jobs[JOB].choice == "severe"
    loop.step([CALM], {JOB: slots(70_000)}, 7.0)
    assert loop.jobs[JOB].choice == "default"


def test_flapping_input_changes_the_choice_once() -> None:
    loop = new_loop(hold=5.0, max_changes_per_minute=6)
    loop.declare(DECLARATION, 0.0)
    changes = 0
    for i in range(600):  # a minute at 10 Hz, congested every other pass
        now = 1.0 + i * 0.1
        actions = loop.step([FULL if i % 2 == 0 else CALM], {JOB: slots(1000 * (i + 1))}, now)
        changes += len([w for w in writes(actions) if any(e.after != "default"
                                                          for e in w.entries)])
    assert changes == 1
    assert [c.kind for c in loop.jobs[JOB].history] == ["declared", "local"]


def test_the_rate_limit_holds_with_no_hysteresis() -> None:
    loop = new_loop(hold=0.0, max_changes_per_minute=3, activation_margin=1)
    loop.declare(DECLARATION, 0.0)
    for i in range(120):  # one pass a second, two congested, two calm: changes every other
        loop.step([FULL if i // 2 % 2 == 0 else CALM], {JOB: slots(10 * i + 5)}, float(i))
    local = [c.time for c in loop.jobs[JOB].history if c.kind == "local"]
    assert len(local) > 3  # it did keep changing, minute after minute ...
    for t in local:  # ... but never more than three times in any minute
        assert len([u for u in local if t <= u < t + 60.0]) <= 3
    assert "rate limit" in loop.jobs[JOB].waiting or loop.jobs[JOB].waiting == ""


def test_no_switch_until_every_active_rank_passed_the_last_activation() -> None:
    loop = new_loop(hold=0.0, activation_margin=100, stall=10.0)
    loop.declare(DECLARATION, 0.0)
    first = entry(loop.step([FULL], {JOB: slots(500, 500)}, 1.0))
    assert writes(loop.step([CALM], {JOB: slots(550, 550)}, 1.2)) == []
    # Calm for the hold now, but one rank is still before the activation point: wait.
    assert writes(loop.step([CALM], {JOB: slots(first.at + 5, first.at - 1)}, 1.5)) == []
    assert "has not passed its activation" in loop.jobs[JOB].waiting
    back = entry(loop.step([CALM], {JOB: slots(first.at + 6, first.at)}, 2.0))
    assert (back.before, back.after) == ("severe", "default")
    assert back.before_rules == first.after_rules and back.after_rules == ()


def test_a_stalled_rank_does_not_block_forever() -> None:
    loop = new_loop(hold=0.0, activation_margin=100, stall=3.0)
    loop.declare(DECLARATION, 0.0)
    first = entry(loop.step([FULL], {JOB: slots(500, 500)}, 1.0))
    assert writes(loop.step([CALM], {JOB: slots(first.at + 1, 500)}, 1.5)) == []
    assert writes(loop.step([CALM], {JOB: slots(first.at + 5, 500)}, 2.0)) == []
    assert writes(loop.step([CALM], {JOB: slots(first.at + 9, 500)}, 5.0))  # idle since 1.0


def test_a_communicator_created_later_joins_the_choice_in_force() -> None:
    loop = new_loop(activation_margin=20)
    loop.declare(DECLARATION, 0.0)
    loop.step([FULL], {JOB: slots(100)}, 1.0)
    other = 0x1234
    actions = loop.step([FULL], {JOB: slots(200) + slots(3, comm=other)}, 1.1)
    joined = entry(actions, other)
    assert (joined.before, joined.after, joined.at) == ("default", "severe", 23)


def test_a_full_policy_never_drops_a_listed_communicator() -> None:
    loop = new_loop()
    loop.declare(DECLARATION, 0.0)
    many = [s for i in range(40) for s in slots(100, comm=1000 + i)]
    (write,) = writes(loop.step([FULL], {JOB: many}, 1.0))
    listed = {e.comm_id for e in write.entries}
    assert len(listed) == 32
    # A communicator with a lower id appears: it stays unlisted, the others stay listed.
    (write,) = writes(loop.step([FULL], {JOB: many + slots(5, comm=1)}, 1.1)) or [write]
    assert {e.comm_id for e in write.entries} == listed
    assert 1 in loop.jobs[JOB].unlisted
    build_policy(write.entries, 1, 10**10)


def test_entries_outlive_a_missed_listing_but_not_the_stall_time() -> None:
    loop = new_loop(stall=5.0)
    loop.declare(DECLARATION, 0.0)
    loop.step([FULL], {JOB: slots(100)}, 1.0)
    assert writes(loop.step([FULL], {JOB: []}, 2.0)) == []  # one empty read: keep it
    assert COMM in loop.jobs[JOB].entries
    (write,) = writes(loop.step([FULL], {JOB: []}, 6.5))
    assert write.entries == ()


def test_a_declaration_without_ranges_never_changes_anything() -> None:
    loop = new_loop(hold=0.0)
    loop.declare(JobDeclaration(JOB), 0.0)
    for i in range(20):
        assert loop.step([FULL if i % 2 else CALM], {JOB: slots(i * 100)}, float(i)) == []


def test_an_older_revision_is_refused() -> None:
    loop = new_loop()
    loop.declare(DECLARATION, 0.0)
    with pytest.raises(ValueError, match="older"):
        loop.declare(JobDeclaration(JOB, revision=0), 1.0)


def test_a_new_revision_with_other_rules_switches_at_an_activation_point() -> None:
    loop = new_loop(activation_margin=10)
    loop.declare(DECLARATION, 0.0)
    old = entry(loop.step([FULL], {JOB: slots(100)}, 1.0))
    narrower = JobDeclaration(JOB, tuning=(TuningRange(
        (Collective.ALLREDUCE,), (Algorithm.RING,), (Protocol.SIMPLE,), 0, 1 << 40, 2, 4),),
        revision=2)
    assert loop.declare(narrower, 1.5) == []
    new = entry(loop.step([FULL], {JOB: slots(old.at + 1)}, 2.0))
    assert new.before_rules == old.after_rules
    assert new.after_rules == derive(narrower).get("severe").rules
    assert new.at >= old.at + 1 + 10


def test_withdrawal_returns_to_nccl_first_then_retires() -> None:
    loop = new_loop(activation_margin=10)
    loop.declare(DECLARATION, 0.0)
    first = entry(loop.step([FULL], {JOB: slots(100)}, 1.0))
    # The switch to severe is still ahead of the ranks: the way back waits for it.
    assert writes(loop.withdraw(JOB, 1.1)) == []
    assert loop.jobs[JOB].entries[COMM] == first
    back = entry(loop.step([FULL], {JOB: slots(first.at)}, 1.2), COMM)
    assert (back.before, back.after) == ("severe", "default")
    assert loop.step([FULL], {JOB: slots(back.at - 1)}, 1.3) == []
    assert loop.step([FULL], {JOB: slots(back.at)}, 1.4) == [Retire(JOB)]
    assert JOB not in loop.jobs


def test_a_quiet_job_retires_at_once() -> None:
    loop = new_loop()
    loop.declare(DECLARATION, 0.0)
    assert loop.withdraw(JOB, 1.0) == [Retire(JOB)]
    with pytest.raises(ValueError, match="no declaration"):
        loop.withdraw(JOB, 2.0)


def test_adopting_a_policy_keeps_it_as_it_was() -> None:
    loop = new_loop()
    loop.declare(DECLARATION, 0.0)
    severe = derive(DECLARATION).get("severe").rules
    published = build_policy([Entry(COMM, 500, "default", "severe", (), severe)], 9, 10**10)
    restarted = new_loop(hold=5.0)
    restarted.declare(DECLARATION, 10.0)
    (write,) = restarted.adopt(JOB, published, 10.0)
    assert build_policy(write.entries, 9, 10**10) == published
    assert restarted.jobs[JOB].choice == "severe"
    # Still congested: nothing to do. Calm: only after the hold.
    assert writes(restarted.step([FULL], {JOB: slots(600)}, 10.1)) == []
    assert writes(restarted.step([CALM], {JOB: slots(700)}, 11.0)) == []


def test_adopted_rules_of_an_older_revision_converge_at_an_activation_point() -> None:
    older = JobDeclaration(JOB, tuning=(TuningRange(
        (Collective.ALLREDUCE,), (Algorithm.TREE,), (Protocol.SIMPLE,), 0, 1 << 40, 1, 2),))
    stale = derive(older).get("congested").rules
    published = build_policy([Entry(COMM, 500, "default", "congested", (), stale)], 9, 10**10)
    loop = new_loop(activation_margin=10)
    loop.declare(DECLARATION, 0.0)
    loop.adopt(JOB, published, 0.0)
    assert loop.jobs[JOB].entries[COMM].after == "previous"
    assert writes(loop.step([CALM], {JOB: slots(400)}, 0.1)) == []  # not past 500 yet
    moved = entry(loop.step([CALM], {JOB: slots(600)}, 0.2))
    assert (moved.before_rules, moved.after_rules) == (stale, ())
    assert moved.at == 600 + 1000  # 2000 collectives a second, times the 0.5 s lead


# --- several hosts --------------------------------------------------------------------


def proposals(actions) -> list:
    return [a.proposal for a in actions if isinstance(a, Propose)]


def test_a_job_spanning_hosts_proposes_and_only_applies_decisions() -> None:
    loop = new_loop(activation_margin=10)
    loop.declare(DECLARATION, 0.0)
    (first,) = proposals(loop.step([CALM], {JOB: slots(100, nodes=2)}, 1.0))
    assert (first.choice, first.severity) == ("default", 0)
    assert [p.comm for p in first.progress] == [wire_comm(COMM)]
    assert first.progress[0].comm < 2**62 and first.progress[0].collectives == 100
    actions = loop.step([FULL], {JOB: slots(200, nodes=2)}, 1.1)
    (proposal,) = proposals(actions)
    assert (proposal.choice, proposal.severity) == ("severe", 2)
    assert writes(actions) == [] and loop.jobs[JOB].entries == {}
    decision = TuningDecision(JOB, "severe", 1, (Activation(wire_comm(COMM), 900),))
    applied = entry(loop.decide(decision, 1.2))
    assert (applied.at, applied.before, applied.after) == (900, "default", "severe")
    assert loop.decide(decision, 1.3) == []  # a repeat changes nothing


def test_decisions_not_ours_to_apply_are_refused() -> None:
    loop = new_loop()
    loop.declare(DECLARATION, 0.0)
    with pytest.raises(ValueError, match="unknown choice"):
        loop.decide(TuningDecision(JOB, "turbo", 1), 1.0)
    with pytest.raises(ValueError, match="no declaration"):
        loop.decide(TuningDecision("other-job", "severe", 1), 1.0)


def test_an_activation_for_a_communicator_not_seen_yet_waits_for_it() -> None:
    loop = new_loop()
    loop.declare(DECLARATION, 0.0)
    loop.decide(TuningDecision(JOB, "congested", 1, (Activation(wire_comm(COMM), 50),)), 1.0)
    assert loop.jobs[JOB].entries == {}
    arrived = entry(loop.step([CALM], {JOB: slots(3, nodes=2)}, 1.1))
    assert (arrived.at, arrived.after) == (50, "congested")


def test_a_late_activation_is_applied_and_counted() -> None:
    loop = new_loop()
    loop.declare(DECLARATION, 0.0)
    loop.step([CALM], {JOB: slots(5000, nodes=2)}, 1.0)
    loop.decide(TuningDecision(JOB, "severe", 1, (Activation(wire_comm(COMM), 4000),)), 1.1)
    assert loop.jobs[JOB].late_activations == 1
    assert loop.jobs[JOB].history[-2].kind == "late"


def test_after_a_decision_the_host_reports_once_its_ranks_passed() -> None:
    loop = new_loop(proposal_refresh=1000.0)
    loop.declare(DECLARATION, 0.0)
    loop.step([CALM], {JOB: slots(100, nodes=2)}, 1.0)
    loop.decide(TuningDecision(JOB, "congested", 1, (Activation(wire_comm(COMM), 300),)), 1.1)
    assert proposals(loop.step([CALM], {JOB: slots(200, nodes=2)}, 1.2)) == []
    (settled,) = proposals(loop.step([CALM], {JOB: slots(301, nodes=2)}, 1.3))
    assert settled.progress[0].collectives == 301
    assert proposals(loop.step([CALM], {JOB: slots(400, nodes=2)}, 1.4)) == []


# --- properties -------------------------------------------------------------------------

trace_step = st.tuples(
    st.sampled_from([CALM, BUSY, FULL, link(0.95, link_class="storage")]),
    st.lists(st.integers(0, 400), min_size=1, max_size=3),  # collectives per rank this pass
    st.sampled_from([0.05, 0.1, 0.1, 1.0, 7.0]),             # seconds since the last pass
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(declarations, st.lists(trace_step, min_size=1, max_size=120),
       st.integers(1, 6), st.floats(0.0, 10.0))
def test_one_host_never_leaves_the_ranges_nor_the_rules_of_safe_switching(
        declaration, trace, max_changes, hold) -> None:
    loop = new_loop(max_changes_per_minute=max_changes, hold=hold, activation_margin=16)
    loop.declare(declaration, 0.0)
    allowed = {c.rules for c in derive(declaration).choices}
    counts = [0, 0, 0]
    now, last = 0.0, None
    moved_at = [0.0, 0.0, 0.0]
    for view, added, dt in trace:
        now += dt
        for rank, n in enumerate(added):
            counts[rank] += n
            if n:
                moved_at[rank] = now
        reported = slots(*counts[:len(added)])
        for action in loop.step([view], {declaration.job: reported}, now):
            assert isinstance(action, WritePolicy)
            for e in action.entries:
                assert e.before_rules in allowed and e.after_rules in allowed
            build_policy(action.entries, 1, 10**10)  # always encodable
            new = next((e for e in action.entries if e.comm_id == COMM), None)
            if new is not None and new != last:
                assert new.at > max(s.collectives for s in reported)  # nobody passed it
                if last is not None:  # and everyone active had passed the previous one
                    assert all(s.collectives >= last.at or now - moved_at[i] >= 10.0
                               for i, s in enumerate(reported))
                last = new
    local = [c.time for c in loop.jobs[declaration.job].history if c.kind == "local"]
    for t in local:
        assert len([u for u in local if t <= u < t + 60.0]) <= max_changes


# --- agents and the agreement together ---------------------------------------------------


def test_two_hosts_publish_identical_policies_through_the_agreement() -> None:
    hosts = {"h1": new_loop(proposal_refresh=0.5), "h2": new_loop(proposal_refresh=0.5)}
    agreement = Agreement(AgreementSettings(lead=1.0, margin=50, hold=2.0))
    agreement.set_hosts(JOB, hosts)
    for loop in hosts.values():
        loop.declare(DECLARATION, 0.0)
    published: dict[str, tuple[Entry, ...]] = {}
    counts = {"h1": 0, "h2": 0}
    for i in range(200):
        now = i * 0.1
        for name, loop in hosts.items():
            counts[name] += 37 if name == "h1" else 36  # ranks drift a little apart
            congested = name == "h1" and 20 <= i < 60   # only h1's link is congested
            for action in loop.step([FULL if congested else CALM],
                                    {JOB: slots(counts[name], nodes=2)}, now):
                if isinstance(action, Propose):
                    agreement.propose(name, action.proposal, now)
                elif isinstance(action, WritePolicy):
                    published[name] = action.entries
        for decision in agreement.step(now):
            for name, loop in hosts.items():
                for action in loop.decide(decision, now):
                    published[name] = action.entries
    kinds = [c.after for c in hosts["h2"].jobs[JOB].history if c.kind == "decided"]
    assert kinds == ["severe", "default"]  # h2 followed h1's congestion, then calm
    assert published["h1"] == published["h2"]
    assert hosts["h1"].jobs[JOB].late_activations == 0
    assert hosts["h2"].jobs[JOB].late_activations == 0
