"""controller/agreement.py: the most severe wish wins, safely and not too often."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.agreement import Agreement, AgreementSettings
from harmonaize.messages import Progress, TuningDecision, TuningProposal

pytestmark = pytest.mark.tuning

JOB = "job-1"
NAMES = ("default", "congested", "severe")


def proposal(severity: int, *progress: tuple[int, int, float]) -> TuningProposal:
    return TuningProposal(JOB, NAMES[severity], severity,
                          tuple(Progress(c, n, r) for c, n, r in progress))


def agreement(**overrides) -> Agreement:
    return Agreement(AgreementSettings(**{"hold": 10.0, "lead": 1.0, "margin": 100,
                                          **overrides}))


def test_the_most_severe_host_wins_at_once() -> None:
    a = agreement()
    a.propose("h1", proposal(0, (7, 1000, 100.0)), 1.0)
    a.propose("h2", proposal(2, (7, 1200, 100.0)), 1.0)
    a.propose("h3", proposal(1, (7, 900, 50.0)), 1.0)
    (decision,) = a.step(1.0)
    assert (decision.job, decision.choice, decision.decision) == (JOB, "severe", 1)
    (activation,) = decision.activations
    assert activation.comm == 7 and activation.at >= 1200 + 100
    assert a.step(1.1) == []  # nothing new
    assert a.current(JOB) == decision


def test_calm_hosts_alone_need_no_decision() -> None:
    a = agreement()
    a.propose("h1", proposal(0, (7, 10, 1.0)), 1.0)
    a.propose("h2", proposal(0, (7, 10, 1.0)), 1.0)
    assert a.step(1.0) == []


def test_activation_projects_each_report_to_now() -> None:
    a = agreement(lead=2.0, margin=10)
    a.propose("h1", proposal(2, (7, 1000, 500.0)), 10.0)  # 4 s old by now: ~3000
    a.propose("h2", proposal(1, (7, 2500, 100.0)), 14.0)
    (decision,) = a.step(14.0)
    assert decision.activations[0].at == 3000 + 1000  # + fastest rate x lead


def passed(host: str, a: Agreement, decision: TuningDecision, severity: int, now: float,
           extra: int = 0) -> None:
    a.propose(host, proposal(severity, *((x.comm, x.at + extra, 100.0)
                                         for x in decision.activations)), now)


def test_a_fall_waits_for_the_hold_and_for_every_host_to_pass() -> None:
    a = agreement(hold=10.0)
    a.propose("h1", proposal(2, (7, 1000, 100.0)), 0.0)
    a.propose("h2", proposal(0, (7, 1000, 100.0)), 0.0)
    (severe,) = a.step(0.0)
    a.propose("h1", proposal(0, (7, 1100, 100.0)), 1.0)  # calm again, not yet past
    assert a.step(1.0) == []
    assert a.step(10.9) == []  # still within the hold
    assert a.step(11.0) == []  # hold over, but no host has reported past the activation
    assert "has not reported" in a.status(JOB)["waiting"]
    passed("h1", a, severe, 0, 12.0)
    assert a.step(12.0) == []  # h2 still owes its report
    passed("h2", a, severe, 0, 12.5)
    (calm,) = a.step(12.5)
    assert calm.choice == "default" and calm.decision == 2
    assert calm.activations[0].at > severe.activations[0].at


def test_a_fall_goes_to_the_highest_wish_seen_during_the_hold() -> None:
    a = agreement(hold=5.0, margin=1)
    a.propose("h1", proposal(2, (7, 10, 1.0)), 0.0)
    (severe,) = a.step(0.0)
    passed("h1", a, severe, 1, 1.0)
    a.step(1.0)
    passed("h1", a, severe, 0, 3.0)
    a.step(3.0)
    (down,) = a.step(6.5)
    assert down.choice == "congested"


def test_decisions_are_rate_limited() -> None:
    a = agreement(hold=0.0, max_decisions_per_minute=2, margin=1)
    times = []
    for i in range(200):
        now = float(i)
        current = a.current(JOB)
        severity = 2 if i // 2 % 2 == 0 else 0
        if current is None:
            a.propose("h1", proposal(severity, (7, 10 * i, 1.0)), now)
        else:
            passed("h1", a, current, severity, now, extra=1)
        for decision in a.step(now):
            times.append(now)
            assert decision.decision == len(times)
    assert len(times) > 2
    for t in times:
        assert len([u for u in times if t <= u < t + 60.0]) <= 2


def test_a_new_communicator_joins_the_choice_in_force() -> None:
    a = agreement(margin=50)
    a.propose("h1", proposal(1, (7, 100, 10.0)), 0.0)
    (first,) = a.step(0.0)
    a.propose("h1", proposal(1, (7, 150, 10.0), (9, 3, 10.0)), 1.0)
    (second,) = a.step(1.0)
    assert second.choice == "congested" and second.decision == 2
    by_comm = {x.comm: x.at for x in second.activations}
    assert by_comm[7] == first.activations[0].at  # unchanged: nothing moves for it
    assert by_comm[9] >= 3 + 50


def test_only_the_jobs_hosts_count_and_stale_reports_expire() -> None:
    a = agreement(proposal_ttl=30.0)
    a.set_hosts(JOB, ["h1", "h2"])
    a.propose("intruder", proposal(2, (7, 10, 1.0)), 0.0)
    assert a.step(0.0) == []
    a.propose("h1", proposal(2, (7, 10, 1.0)), 0.0)
    assert a.step(31.0) == []  # h1's wish is too old to act on


def test_a_new_revision_switches_the_communicators_again() -> None:
    a = agreement(margin=10)
    a.declared(JOB, 1)
    a.propose("h1", proposal(1, (7, 100, 1.0)), 0.0)
    (first,) = a.step(0.0)
    a.declared(JOB, 2)
    assert a.step(0.5) == []  # h1 has not reported past the first activation yet
    passed("h1", a, first, 1, 1.0)
    (again,) = a.step(1.0)
    assert again.choice == "congested" and again.activations[0].at > first.activations[0].at


def test_decision_numbers_keep_rising_across_restarts() -> None:
    a = Agreement(numbers={JOB: 41})
    a.propose("h1", proposal(2, (7, 1, 1.0)), 0.0)
    (decision,) = a.step(0.0)
    assert decision.decision == 42


reports = st.lists(st.tuples(
    st.sampled_from(["h1", "h2", "h3", "h4"]),
    st.integers(0, 2),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**9), st.floats(0.0, 1e5)),
             max_size=4),
    st.floats(0.0, 30.0)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(reports, st.floats(0.0, 30.0), st.randoms(use_true_random=False))
def test_decisions_are_deterministic_and_activations_lie_ahead(batch, now, rnd) -> None:
    latest = {}
    for report in sorted(batch, key=lambda r: (r[3], repr(r))):
        latest[report[0]] = report  # what the controller holds: each host's newest
    rows = [r for r in latest.values() if r[3] <= now]
    results = []
    for ordering in (rows, rnd.sample(rows, len(rows))):
        a = agreement(proposal_ttl=1000.0)
        for host, severity, progress, at in ordering:
            a.propose(host, proposal(severity, *progress), at)
        results.append(a.step(now))
    assert results[0] == results[1]  # whatever order the hosts' reports came in
    top = max((r[1] for r in rows), default=0)
    assert [d.choice for d in results[0]] == ([NAMES[top]] if top else [])
    for decision in results[0]:
        for activation in decision.activations:
            ahead = [n + rate * (now - at) for _, _, progress, at in rows
                     for c, n, rate in progress if c == activation.comm]
            assert activation.at >= max(ahead) + 100
