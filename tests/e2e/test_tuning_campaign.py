"""Fault schedules, drawn by hypothesis, played through the real plugin, loop and agreement.

The short version of ``./scripts/bench tuning-divergence``: every schedule
(hosts, ranks, rates, skews, congestion, and faults at random times: agents
killed, stopped, restarted into a recreated, corrupted or missing policy,
killed right after arming; the controller killed, also between sending one
host an outcome and the next; messages delayed, lost, hosts partitioned; a
declaration arriving after the ranks started; ranks stalling) must end with
every rank having answered alike at every collective, and none left waiting.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.tuningsim import FAULT_KINDS, Fault, Schedule, random_schedule, run

pytestmark = pytest.mark.tuning


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    hosts = draw(st.sampled_from([1, 2, 2, 3]))
    duration = 8.0
    congestion = []
    t = draw(st.floats(0.3, 1.5))
    while t < duration - 1.0:
        length = draw(st.floats(0.5, 3.0))
        congestion.append((t, t + length, draw(st.integers(0, hosts - 1)),
                           draw(st.sampled_from([1, 2]))))
        t += length + draw(st.floats(0.3, 2.0))
    faults = [Fault(draw(st.sampled_from(FAULT_KINDS)), draw(st.floats(0.3, duration - 1.0)),
                    draw(st.integers(0, hosts - 1)), draw(st.floats(0.1, 4.0)),
                    draw(st.integers(0, 2)))
              for _ in range(draw(st.integers(1, 3)))]
    return Schedule(
        seed=draw(st.integers(0, 2**31)), hosts=hosts,
        ranks_per_host=draw(st.integers(1, 3)),
        rate=draw(st.sampled_from([15.0, 80.0, 400.0, 1500.0])),
        skew=draw(st.sampled_from([0.0, 0.003, 0.05, 0.3, 1.0])), duration=duration,
        congestion=tuple(congestion), faults=tuple(sorted(faults, key=lambda f: f.at)),
        margin=draw(st.sampled_from([2, 8, 64])), lead=draw(st.sampled_from([0.0, 0.05, 0.5])),
        pause=draw(st.sampled_from([0.0, 0.002])))


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(schedule=schedules())
def test_no_fault_schedule_makes_ranks_disagree(schedule: Schedule) -> None:
    result = run(schedule)
    assert not result.diverged, f"{result.diverged} -- {schedule.describe()}"
    assert result.stuck == 0, f"{result.stuck} rank(s) left waiting -- {schedule.describe()}"


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_alone(kind: str) -> None:
    """Every fault kind once, on a two-host job that switches while it strikes."""
    base = random_schedule(7, max_rate=800.0, duration=8.0, kinds=(kind,))
    schedule = Schedule(base.seed, 2, 2, 300.0, 0.05, 8.0,
                        ((1.0, 4.0, 0, 2), (5.0, 7.0, 1, 1)),
                        (Fault(kind, 1.05 if kind != "late-declaration" else 0.0, 0, 1.5),),
                        margin=16, lead=0.2)
    result = run(schedule)
    assert not result.diverged, f"{result.diverged} -- {schedule.describe()}"
    assert result.stuck == 0
    assert result.switches >= 1 or kind in ("late-declaration",)
