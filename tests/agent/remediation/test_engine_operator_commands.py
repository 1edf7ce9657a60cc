"""Operators' commands to the remediation engine: cancel, resume, clear, by index; its holds."""

from __future__ import annotations

import pytest

from agent.remediation.engine import RemediationEngine
from agent.remediation.types import Log, Phase, Record, Step
from harmonaize.messages import Hold, HoldKind
from tests.agent.remediation.test_engine import ACT, gpu

pytestmark = pytest.mark.scheduler


def test_cancel_from_each_phase_and_from_idle_records_what_it_was() -> None:
    engine = RemediationEngine(ACT)
    engine.step([gpu(processes=1), gpu(3, state="healthy")], 0.0, "b1")
    assert engine.cancel(2, 1.0) == [Log("GPU-2", 2, Step.CANCELLED, "operator", "was waiting")]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.CANCELLED, 0, 1.0, "",
                                             float("-inf"), "cancelled by an operator")
    assert engine.cancel(2, 2.0) == []  # already cancelled
    assert engine.cancel(3, 3.0) == [Log("GPU-3", 3, Step.CANCELLED, "operator", "was idle")]
    assert engine.records["GPU-3"].gpu == 3
    for phase in (Phase.RESETTING, Phase.REVALIDATING, Phase.REBOOT, Phase.AFTER_REBOOT):
        engine = RemediationEngine(ACT, [Record("GPU-2", 2, phase)])
        assert engine.cancel(2, 1.0)[0].detail == f"was {phase}"
        assert engine.records["GPU-2"].phase is Phase.CANCELLED
        assert engine.holds() == ()
    with pytest.raises(KeyError, match="no GPU 7"):
        engine.cancel(7, 1.0)


def test_resume_restarts_waiting_and_only_from_cancelled() -> None:
    engine = RemediationEngine(ACT, [Record("GPU-2", 2, Phase.CANCELLED, 1)])
    assert engine.resume(2, 5.0) == [Log("GPU-2", 2, Step.RESUMED, "operator")]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.WAITING, 1, 5.0, "",
                                             float("-inf"), "waiting")
    with pytest.raises(ValueError, match="not cancelled"):
        engine.resume(2, 6.0)
    engine.step([gpu(3, state="healthy")], 7.0, "b1")
    with pytest.raises(ValueError, match="not cancelled"):
        engine.resume(3, 8.0)


def test_clear_only_ends_an_rma_hold() -> None:
    engine = RemediationEngine(ACT, [Record("GPU-2", 2, Phase.RMA, 2)])
    assert engine.clear(2) == [Log("GPU-2", 2, Step.CLEARED, "operator", "RMA hold cleared")]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.CANCELLED, 2, 0.0, "",
                                             float("-inf"), "RMA cleared by an operator")
    assert engine.changed == {"GPU-2"}
    with pytest.raises(ValueError, match="not held for RMA"):
        engine.clear(2)
    engine.step([gpu(3, state="healthy")], 1.0, "b1")
    with pytest.raises(ValueError, match="not held for RMA"):
        engine.clear(3)


def test_an_operator_command_by_index_acts_on_the_gpu_now_at_that_index() -> None:
    # GPU 2 was replaced (another UUID at the same index): the old record is not it.
    engine = RemediationEngine(ACT, [Record("GPU-old", 2, Phase.RMA)])
    engine.step([gpu(2, state="healthy")], 0.0, "b1")
    with pytest.raises(ValueError, match="not held for RMA"):
        engine.clear(2)
    # Not seen in this pass: the record at that index is the one.
    engine = RemediationEngine(ACT, [Record("GPU-old", 2, Phase.RMA)])
    assert engine.clear(2)[0].uuid == "GPU-old"


def test_holds_per_phase_sorted_by_gpu() -> None:
    engine = RemediationEngine(ACT, [
        Record("G5", 5, Phase.RMA), Record("G4", 4, Phase.AFTER_REBOOT),
        Record("G3", 3, Phase.REVALIDATING), Record("G1", 1, Phase.REBOOT, 3),
        Record("G0", 0, Phase.WAITING), Record("G6", 6, Phase.RESETTING),
        Record("G7", 7, Phase.CANCELLED)])
    assert engine.holds() == (
        Hold(HoldKind.REBOOT, 1, "3 failed reset(s)"),
        Hold(HoldKind.GPU_QUARANTINED, 3, "validating after reset"),
        Hold(HoldKind.GPU_QUARANTINED, 4, "validating after reboot"),
        Hold(HoldKind.RMA, 5, "reset and reboot did not help"))
