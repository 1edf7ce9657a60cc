"""Properties of the tuning loop over random traces: ranks on one host always agree."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.tuning.loop import resolved_policy, wire_comm
from agent.tuning.policies import derive
from harmonaize.messages import Activation, TuningResolve
from tests.agent.tuning.test_loop import (
    BUSY,
    CALM,
    COMM,
    FULL,
    JOB,
    Host,
    agree,
    arm,
    link,
    multi_host,
    race,
)
from tests.agent.tuning.test_policies import declarations

pytestmark = pytest.mark.tuning


# --- properties ----------------------------------------------------------------------

trace_step = st.tuples(
    st.sampled_from([CALM, BUSY, FULL, link(0.95, link_class="storage")]),
    st.lists(st.integers(0, 400), min_size=2, max_size=2),  # collectives per rank this pass
    st.sampled_from([0.05, 0.1, 0.1, 1.0, 7.0]),             # seconds since the last pass
    st.booleans(),                                            # a rank races unseen
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(declarations, st.lists(trace_step, min_size=1, max_size=80),
       st.integers(1, 6), st.floats(0.0, 10.0), st.sampled_from([1, 4, 64]))
def test_one_host_ranks_always_agree_and_rules_stay_declared(
        declaration, trace, max_changes, hold, margin) -> None:
    host = Host(max_changes_per_minute=max_changes, hold=hold, activation_margin=margin)
    host.declare(declaration)
    host.add(2)
    allowed = {c.rules for c in derive(declaration).choices}
    now = 0.0
    for view, added, dt, racing in trace:
        now += dt
        for rank, count in enumerate(added):
            host.advance(count, rank=rank)
        if racing:
            race(host)
        host.step(view, now)
        host.blind.clear()
        host.between.clear()
        for entry in host.job.entries.values():
            assert entry.before_rules in allowed and entry.after_rules in allowed
        assert agree(host)
    local = [c.time for c in host.job.history if c.kind == "local"]
    for t in local:
        assert len([u for u in local if t <= u < t + 60.0]) <= max_changes


@pytest.mark.parametrize("commit", [True, False])
def test_an_outcome_heard_before_the_declaration_resolves_the_file(commit) -> None:
    """A restarted agent may hear the outcome of its predecessor's arm before the
    declaration comes again: the outcome needs no rules, only the file."""
    host = multi_host()
    arm(host)
    message = TuningResolve(JOB, 1, commit, (Activation(wire_comm(COMM), 2000),))
    resolved = resolved_policy(host.policy, message)
    assert resolved is not None
    entry = resolved.entry(COMM)
    assert not entry.pending and entry.revision == host.entry().revision + 1
    held = host.policy.view(COMM)
    assert (resolved.view(COMM).after == held.after) is commit
    for rank in host.ranks[COMM]:
        rank.see(resolved.view(COMM))
    host.advance(3000)
    assert agree(host) and all(r.n == 3500 for r in host.ranks[COMM])
    other = TuningResolve(JOB, 1, commit, (Activation(wire_comm(COMM), 1999),))
    assert resolved_policy(host.policy, other) is None  # not this entry's switch
