"""Condition hysteresis to the letter: exact conditions and events at each step."""

from __future__ import annotations

import pytest

from agent.conditions import ConditionTracker, Finding, health_of
from harmonaize.messages import Condition, Health, HostEvent, Severity, Status

pytestmark = [pytest.mark.foundation, pytest.mark.hardening]


def test_set_escalate_and_clear_with_exact_conditions_and_events() -> None:
    tracker = ConditionTracker()
    quiet = Finding("DiskPressure", False, sustain=2.0)
    hot = Finding("Thermal", True, Severity.WARNING, "Hot", "81 C", sustain=2.0)
    # A new type starts false, since now; an unchanged first finding must not stop the rest.
    assert tracker.update([quiet, hot], 10.0) == []
    assert tracker.conditions() == (Condition("DiskPressure", Status.FALSE, since=10.0),
                                    Condition("Thermal", Status.FALSE, since=10.0))
    assert tracker.update([quiet, hot], 11.9) == []  # not held long enough
    assert tracker.update([quiet, hot], 12.0) == [
        HostEvent("ThermalStarted", Severity.WARNING, "81 C")]
    thermal = Condition("Thermal", Status.TRUE, "Hot", "81 C", Severity.WARNING, 12.0)
    assert tracker.holding() == [thermal]
    # Worse while it holds: the words and severity follow at once, `since` stays.
    worse = Finding("Thermal", True, Severity.CRITICAL, "VeryHot", "95 C", sustain=2.0)
    assert tracker.update([quiet, worse], 13.0) == []
    assert tracker.holding() == [
        Condition("Thermal", Status.TRUE, "VeryHot", "95 C", Severity.CRITICAL, 12.0)]
    assert health_of(tracker.conditions()) is Health.UNHEALTHY
    # Gone: it clears only after the same sustain, with an INFO event and no words.
    cool = Finding("Thermal", False, sustain=2.0)
    assert tracker.update([quiet, cool], 14.0) == []
    assert tracker.update([quiet, worse], 14.5) == []  # back: the clearing starts over
    assert tracker.update([quiet, cool], 15.0) == []
    assert tracker.update([quiet, cool], 16.9) == []
    assert tracker.update([quiet, cool], 17.0) == [HostEvent("ThermalEnded", Severity.INFO, "")]
    assert tracker.conditions() == (Condition("DiskPressure", Status.FALSE, since=10.0),
                                    Condition("Thermal", Status.FALSE, since=17.0))
    assert health_of(tracker.conditions()) is Health.HEALTHY


def test_without_sustain_a_finding_applies_in_the_same_step() -> None:
    tracker = ConditionTracker()
    assert tracker.update([Finding("Link", True, Severity.CRITICAL, "Down", "eth1")], 1.0) == [
        HostEvent("LinkStarted", Severity.CRITICAL, "eth1")]
    assert tracker.conditions() == (
        Condition("Link", Status.TRUE, "Down", "eth1", Severity.CRITICAL, 1.0),)
    assert tracker.update([Finding("Link", False)], 2.0) == [
        HostEvent("LinkEnded", Severity.INFO, "")]


def test_one_finding_waiting_out_its_sustain_does_not_hold_up_the_next() -> None:
    tracker = ConditionTracker()
    slow = Finding("Slow", True, sustain=60.0)
    fast = Finding("Fast", True, Severity.WARNING, "Now", "at once")
    assert tracker.update([slow, fast], 1.0) == [HostEvent("FastStarted", Severity.WARNING,
                                                           "at once")]
