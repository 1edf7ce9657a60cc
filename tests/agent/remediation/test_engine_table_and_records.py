"""The remediation engine's table of moves, and what its records keep: since when, why, bounded."""

from __future__ import annotations

import pytest

from agent.remediation.engine import TRANSITIONS, Event, RemediationEngine
from agent.remediation.types import GpuSeen, Log, Phase, Record, Reset, Settings, Step, Validate
from tests.agent.remediation.test_engine import ACT, BUS, gpu, resets, started

pytestmark = pytest.mark.scheduler


def test_a_move_not_in_the_table_raises_and_names_it() -> None:
    engine = RemediationEngine(ACT, [Record("GPU-2", 2, Phase.RMA)])
    with pytest.raises(ValueError, match="no move from rma on operator resume"):
        engine._move("GPU-2", Event.RESUME)


def test_every_table_row_moves_where_it_says() -> None:
    for (phase, event), nxt in TRANSITIONS.items():
        records = [] if phase is None else [Record("GPU-2", 2, phase)]
        engine = RemediationEngine(ACT, records)
        moved = engine._move("GPU-2", event, gpu=2)
        assert (moved.phase if moved else None) is nxt, (phase, event)
        assert ("GPU-2" in engine.records) is (nxt is not None)
        assert engine.changed == {"GPU-2"}


def test_no_deadline_before_the_first_pass() -> None:
    assert RemediationEngine(ACT).next_deadline() == float("inf")


def test_a_gpu_not_in_remediation_does_not_stop_the_pass() -> None:
    engine = RemediationEngine(ACT)
    assert resets(engine.step([gpu(1, state="healthy"), gpu(2)], 0.0, "b1")) == [
        Reset("GPU-2", 2, BUS)]


def test_a_blocked_gpu_records_since_when_it_waits_and_a_reset_since_when_it_started() -> None:
    engine = RemediationEngine(ACT)
    engine.step([gpu(processes=1)], 5.0, "b1")
    assert engine.records["GPU-2"].since == 5.0
    engine.step([gpu()], 9.0, "b1")
    assert engine.records["GPU-2"].since == 9.0


def test_the_reset_step_says_what_triggered_it_bounded() -> None:
    engine = RemediationEngine(ACT)
    why = GpuSeen(2, "GPU-2", BUS, "quarantined", "reset-gpu", "w" * 300, 0)
    assert engine.step([why], 0.0, "b1")[1] == Log("GPU-2", 2, Step.RESET, "w" * 200,
                                                   "attempt 1")
    engine = RemediationEngine(ACT)
    bare = GpuSeen(2, "GPU-2", BUS, "quarantined", "reset-gpu", "", 0)
    assert engine.step([bare], 0.0, "b1")[1] == Log("GPU-2", 2, Step.RESET, "quarantined",
                                                    "attempt 1")


def test_a_failed_validation_after_reset_is_bounded_and_escalates_in_its_boot() -> None:
    engine = started(Settings(shadow=False, max_resets=1))
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    actions = engine.verdict("GPU-2", False, "s" * 300, 2.0, "b1")
    assert actions[0] == Log("GPU-2", 2, Step.REVALIDATION_FAILED,
                             f"validation failed after reset: {'s' * 300}"[:200])
    assert engine.records["GPU-2"].boot_id == "b1"


def test_a_gpu_quarantined_again_after_its_release_is_validated_again() -> None:
    engine = started()
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    engine.step([gpu()], 2.0, "b1")
    engine.verdict("GPU-2", True, "ok", 3.0, "b1")
    engine.step([gpu()], 700.0, "b1")  # the same GPU fails again later
    engine.reset_done("GPU-2", True, "ok", 701.0, "b1")
    assert engine.step([gpu()], 702.0, "b1") == [Validate(2, "after-reset")]
