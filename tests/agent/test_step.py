"""The sans-I/O host health engine, driven with a fake clock."""

from __future__ import annotations

import pytest

from agent.config import ObserversSection
from agent.host.settings import HostObserverSection
from agent.host.types import HostSample
from agent.observations import Observations
from agent.step import ConditionTracker, Finding, HostHealthEngine, Republisher, health_of
from harmonaize.messages import Condition, Health, Severity, Status

pytestmark = pytest.mark.foundation

GIB = 1 << 30


def sample(available_fraction: float) -> Observations:
    return Observations(host=HostSample(0.1, 100 * GIB, int(available_fraction * 100 * GIB),
                                        0.5, 100.0))


def test_tracker_needs_a_problem_to_persist_before_setting_and_clearing() -> None:
    tracker = ConditionTracker()
    bad = Finding("Thing", True, Severity.WARNING, "Bad", "it is bad", sustain=2.0)
    good = Finding("Thing", False, sustain=2.0)
    assert tracker.update([good], 0.0) == []
    assert tracker.update([bad], 1.0) == []          # pending since 1.0
    assert tracker.update([good], 2.0) == []         # blip over: pending cleared
    assert tracker.update([bad], 3.0) == []
    assert tracker.update([bad], 4.9) == []
    events = tracker.update([bad], 5.0)             # held for 2 s
    assert [e.reason for e in events] == ["ThingStarted"]
    (condition,) = tracker.holding()
    assert (condition.reason, condition.since, condition.severity) == ("Bad", 5.0, Severity.WARNING)
    assert tracker.update([good], 6.0) == []
    assert tracker.update([bad], 6.5) == []          # still set; clearing restarts
    assert tracker.update([good], 7.0) == []
    assert [e.reason for e in tracker.update([good], 9.0)] == ["ThingEnded"]
    assert tracker.holding() == []


def test_tracker_refreshes_the_message_without_a_transition() -> None:
    tracker = ConditionTracker()
    tracker.update([Finding("T", True, message="one")], 0.0)
    assert tracker.update([Finding("T", True, message="two")], 1.0) == []
    (condition,) = tracker.holding()
    assert (condition.message, condition.since) == ("two", 0.0)


def test_health_is_the_worst_severity_holding() -> None:
    def cond(severity: Severity, status: Status = Status.TRUE) -> Condition:
        return Condition("X", status, severity=severity)

    assert health_of([]) is Health.HEALTHY
    assert health_of([cond(Severity.INFO)]) is Health.HEALTHY
    assert health_of([cond(Severity.WARNING), cond(Severity.INFO)]) is Health.DEGRADED
    assert health_of([cond(Severity.CRITICAL), cond(Severity.WARNING)]) is Health.UNHEALTHY
    assert health_of([cond(Severity.CRITICAL, Status.FALSE)]) is Health.HEALTHY


def test_memory_pressure_needs_to_be_sustained() -> None:
    host = HostObserverSection(memory_available_min=0.05, sustain=2.0)
    engine = HostHealthEngine(ObserversSection(host=host))
    assert engine.step(sample(0.5), 0.0).summary.health is Health.HEALTHY
    assert engine.step(sample(0.01), 1.0).summary.health is Health.HEALTHY
    step = engine.step(sample(0.01), 3.0)
    assert step.summary.health is Health.DEGRADED
    assert [e.reason for e in step.events] == ["MemoryPressureStarted"]
    assert "1.0% of memory available" in step.events[0].message
    assert engine.step(sample(0.5), 4.0).summary.health is Health.DEGRADED
    assert engine.step(sample(0.5), 6.0).summary.health is Health.HEALTHY


def test_failing_observers_degrade_the_host_at_once() -> None:
    engine = HostHealthEngine(ObserversSection())
    step = engine.step(Observations(), 0.0, failing={"links": "bcc missing"})
    assert step.summary.health is Health.DEGRADED
    (condition,) = [c for c in step.summary.conditions if c.status is Status.TRUE]
    assert condition.type == "ObserverFailure" and "links: bcc missing" in condition.message


def test_drain_withdraws_the_host_without_degrading_it() -> None:
    engine = HostHealthEngine(ObserversSection())
    step = engine.step(sample(0.5), 0.0, drained="maintenance")
    assert step.summary.schedulable is False
    assert step.summary.health is Health.HEALTHY
    assert [e.reason for e in step.events] == ["DrainedStarted"]
    step = engine.step(sample(0.5), 1.0, drained=None)
    assert step.summary.schedulable is True
    assert [e.reason for e in step.events] == ["DrainedEnded"]


def test_republisher_sends_on_change_and_when_due() -> None:
    gate = Republisher(refresh=10.0)
    assert gate.due("a", 0.0)
    assert not gate.due("a", 5.0)
    assert gate.due("b", 6.0)
    assert not gate.due("b", 15.0)
    assert gate.due("b", 16.0)
    gate.force()
    assert gate.due("b", 16.1)
