"""The remediation engine on its own (sans-I/O): its table, its limits, its escalation."""

from __future__ import annotations

import pytest

from agent.remediation.engine import TRANSITIONS, Event, RemediationEngine
from agent.remediation.types import (
    GpuSeen,
    Log,
    Phase,
    Reset,
    Settings,
    Step,
    Validate,
    Would,
)
from harmonaize.messages import Hold, HoldKind

pytestmark = pytest.mark.scheduler

ACT = Settings(shadow=False, max_resets=2, reset_interval=600.0, max_resets_per_hour=4)


def gpu(index: int = 2, state: str = "quarantined", processes: int | None = 0,
        action: str = "reset-gpu") -> GpuSeen:
    return GpuSeen(index, f"GPU-{index}", f"00000000:{index:02X}:00.0", state, action,
                   "EccUncorrectable", processes)


def resets(actions: list) -> list[Reset]:
    return [a for a in actions if isinstance(a, Reset)]


def test_every_phase_can_be_left_and_only_an_operator_leaves_rma() -> None:
    phases = {p for (p, _), _ in TRANSITIONS.items() if p is not None}
    assert phases == set(Phase)
    assert [e for (p, e) in TRANSITIONS if p is Phase.RMA] == [Event.CLEAR]


def test_a_gpu_in_use_is_never_reset_and_unknown_processes_count_as_use() -> None:
    engine = RemediationEngine(ACT)
    for processes in (1, None):
        assert resets(engine.step([gpu(processes=processes)], 100.0, "b1")) == []
    assert "processes" in engine.records["GPU-2"].detail
    assert resets(engine.step([gpu(processes=0)], 101.0, "b1")) == [
        Reset("GPU-2", 2, "00000000:02:00.0")]


def test_reset_interval_per_gpu_and_hourly_limit_per_host() -> None:
    engine = RemediationEngine(Settings(shadow=False, max_resets=5, reset_interval=600.0,
                                        max_resets_per_hour=2))
    engine.step([gpu(2)], 0.0, "b1")
    engine.reset_done("GPU-2", False, "exit 255", 1.0, "b1")
    assert resets(engine.step([gpu(2)], 599.0, "b1")) == []
    assert engine.next_deadline() == 600.0
    assert "rate limit" in engine.records["GPU-2"].detail
    assert len(resets(engine.step([gpu(2)], 600.0, "b1"))) == 1
    engine.reset_done("GPU-2", False, "exit 255", 601.0, "b1")
    # Two resets within the hour: a third GPU waits for the oldest to age out.
    assert resets(engine.step([gpu(2), gpu(3)], 1300.0, "b1")) == []
    assert "resets on this host" in engine.records["GPU-3"].detail
    assert len(resets(engine.step([gpu(2), gpu(3)], 3600.0, "b1"))) == 1


def test_failed_resets_escalate_to_a_reboot_hold_then_rma_after_a_reboot() -> None:
    engine = RemediationEngine(ACT)
    engine.step([gpu()], 0.0, "b1")
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    asked = engine.step([gpu()], 2.0, "b1")
    assert asked == [Validate(2, "after-reset")]
    # Out of quarantine, not yet proven: the scheduler must not hand it work meanwhile.
    assert engine.holds() == (Hold(HoldKind.GPU_QUARANTINED, 2, "validating after reset"),)
    engine.verdict("GPU-2", False, "burn: slow", 3.0, "b1")
    assert engine.records["GPU-2"].phase is Phase.WAITING
    engine.step([gpu()], 700.0, "b1")
    actions = engine.reset_done("GPU-2", False, "exit 255: in use", 701.0, "b1")
    assert [a.step for a in actions if isinstance(a, Log)] == [Step.RESET_FAILED, Step.REBOOT]
    assert engine.holds() == (Hold(HoldKind.REBOOT, 2, "2 failed reset(s)"),)
    assert engine.step([gpu()], 800.0, "b1") == []  # the same boot: still waiting
    assert Validate(2, "after-reboot") in engine.step([gpu()], 900.0, "b2")
    assert engine.holds() == (Hold(HoldKind.GPU_QUARANTINED, 2, "validating after reboot"),)
    engine.verdict("GPU-2", False, "burn: slow", 901.0, "b2")
    assert engine.holds() == (Hold(HoldKind.RMA, 2, "reset and reboot did not help"),)
    with pytest.raises(ValueError, match="RMA"):
        engine.cancel(2, 902.0)
    engine.step([gpu(state="healthy")], 903.0, "b2")  # released elsewhere: RMA stays
    engine.step([gpu()], 903.5, "b2")
    assert engine.holds()[0].kind is HoldKind.RMA
    engine.clear(2)
    assert engine.holds() == () and engine.records["GPU-2"].phase is Phase.CANCELLED
    assert resets(engine.step([gpu()], 904.0, "b2")) == []  # the operator took over


def test_a_pass_after_reset_ends_remediation() -> None:
    engine = RemediationEngine(ACT)
    engine.step([gpu()], 0.0, "b1")
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    engine.step([gpu()], 2.0, "b1")
    actions = engine.verdict("GPU-2", True, "1 check(s) passed", 3.0, "b1")
    assert [a.step for a in actions if isinstance(a, Log)] == [Step.RELEASED]
    assert engine.records == {}


def test_shadow_says_once_what_it_would_do_and_does_nothing() -> None:
    engine = RemediationEngine(Settings(shadow=True))
    first = engine.step([gpu()], 0.0, "b1")
    assert [type(a) for a in first] == [Would]
    assert engine.step([gpu()], 1.0, "b1") == []
    assert engine.records["GPU-2"].phase is Phase.WAITING and engine.resets == []
    assert engine.step([gpu(state="healthy")], 2.0, "b1") == []  # released: no history
    assert engine.records == {}


def test_cancel_stops_and_resume_restarts() -> None:
    engine = RemediationEngine(ACT)
    engine.step([gpu(processes=1)], 0.0, "b1")
    engine.cancel(2, 1.0)
    assert resets(engine.step([gpu()], 2.0, "b1")) == []
    engine.resume(2, 3.0)
    assert len(resets(engine.step([gpu()], 4.0, "b1"))) == 1


# Shared with the files that pin each move, the limits, and the table and records.
ECC = "EccUncorrectable"
BUS = "00000000:02:00.0"


def started(settings: Settings = ACT) -> RemediationEngine:
    """An engine whose GPU 2 is being reset (started at 0.0 in boot b1)."""
    engine = RemediationEngine(settings)
    engine.step([gpu()], 0.0, "b1")
    engine.changed.clear()
    return engine
