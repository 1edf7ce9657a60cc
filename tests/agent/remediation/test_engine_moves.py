"""Each move of the remediation engine pinned down exactly: its actions, record, what persists."""

from __future__ import annotations

import pytest

from agent.remediation.engine import RemediationEngine
from agent.remediation.types import Log, Phase, Record, Reset, Settings, Step, Validate
from harmonaize.messages import Hold, HoldKind
from tests.agent.remediation.test_engine import ACT, BUS, ECC, gpu, started

pytestmark = pytest.mark.scheduler


# --- Each move pinned down exactly: the actions, the record, what is to persist ------------


def test_a_reset_starts_with_a_reset_and_a_history_step_and_persists_the_record() -> None:
    engine = RemediationEngine(ACT)
    assert engine.step([gpu()], 5.0, "b1") == [
        Reset("GPU-2", 2, BUS), Log("GPU-2", 2, Step.RESET, ECC, "attempt 1")]
    assert engine.records == {"GPU-2": Record("GPU-2", 2, Phase.RESETTING, 0, 5.0, "", 5.0,
                                              "resetting")}
    assert engine.changed == {"GPU-2"} and engine.resets == [5.0]


def test_only_a_quarantined_gpu_recommended_for_reset_enters_remediation() -> None:
    engine = RemediationEngine(ACT)
    assert engine.step([gpu(action="drain"), gpu(3, state="healthy")], 0.0, "b1") == []
    assert engine.records == {} and engine.changed == set()


def test_a_reset_that_succeeds_moves_to_revalidating_and_asks_validation_once() -> None:
    engine = started()
    assert engine.reset_done("GPU-2", True, "ok " * 100, 1.0, "b1") == [
        Log("GPU-2", 2, Step.RESET_DONE, "the reset command", ("ok " * 100)[:200])]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.REVALIDATING, 0, 1.0, "", 0.0,
                                             "validating after reset")
    assert engine.changed == {"GPU-2"}
    assert engine.step([gpu()], 2.0, "b1") == [Validate(2, "after-reset")]
    assert engine.step([gpu()], 3.0, "b1") == []  # asked once per run
    assert engine.verdict("GPU-2", None, "undecided", 4.0, "b1") == []
    assert engine.step([gpu()], 5.0, "b1") == [Validate(2, "after-reset")]  # asked again


def test_a_failed_reset_counts_and_waits_with_its_reason() -> None:
    engine = started()
    long = "x" * 300
    assert engine.reset_done("GPU-2", False, long, 1.0, "b1") == [
        Log("GPU-2", 2, Step.RESET_FAILED, f"the reset command: {long}"[:200])]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.WAITING, 1, 1.0, "", 0.0,
                                             f"the reset command: {long}"[:200])
    assert engine.changed == {"GPU-2"}


def test_a_failed_validation_after_reset_counts_and_a_new_reset_is_validated_again() -> None:
    engine = started(Settings(shadow=False, max_resets=3, reset_interval=10.0))
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    engine.step([gpu()], 2.0, "b1")
    assert engine.verdict("GPU-2", False, "burn: slow", 3.0, "b1") == [
        Log("GPU-2", 2, Step.REVALIDATION_FAILED, "validation failed after reset: burn: slow")]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.WAITING, 1, 3.0, "", 0.0,
                                             "validation failed after reset: burn: slow")
    assert engine.step([gpu()], 10.0, "b1") == [
        Reset("GPU-2", 2, BUS), Log("GPU-2", 2, Step.RESET, ECC, "attempt 2")]
    engine.reset_done("GPU-2", True, "ok", 11.0, "b1")
    assert engine.step([gpu()], 12.0, "b1") == [Validate(2, "after-reset")]


def test_escalation_after_max_resets_asks_for_a_reboot_with_the_count() -> None:
    engine = started(Settings(shadow=False, max_resets=1))
    assert engine.reset_done("GPU-2", False, "exit 255", 1.0, "b1") == [
        Log("GPU-2", 2, Step.RESET_FAILED, "the reset command: exit 255"),
        Log("GPU-2", 2, Step.REBOOT, "1 failed reset(s)", "asked the scheduler to reboot")]
    assert engine.records["GPU-2"] == Record(
        "GPU-2", 2, Phase.REBOOT, 1, 1.0, "b1", 0.0,
        "1 failed reset(s): the scheduler should reboot")
    assert engine.holds() == (Hold(HoldKind.REBOOT, 2, "1 failed reset(s)"),)


def test_escalation_from_a_failed_validation_after_reset() -> None:
    engine = started(Settings(shadow=False, max_resets=1))
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    assert [a.step for a in engine.verdict("GPU-2", False, "slow", 2.0, "b1")
            if isinstance(a, Log)] == [Step.REVALIDATION_FAILED, Step.REBOOT]
    assert engine.records["GPU-2"].phase is Phase.REBOOT


def rebooting() -> RemediationEngine:
    engine = started(Settings(shadow=False, max_resets=1))
    engine.reset_done("GPU-2", False, "exit 255", 1.0, "b1")
    engine.changed.clear()
    return engine


def test_a_new_boot_id_moves_a_reboot_to_validation_before_anything_else() -> None:
    engine = rebooting()
    assert engine.step([gpu()], 2.0, "") == []  # no boot id known: waits
    assert engine.step([gpu(state="healthy")], 3.0, "b2") == [
        Log("GPU-2", 2, Step.REBOOTED, "boot id changed"), Validate(2, "after-reboot")]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.AFTER_REBOOT, 1, 3.0, "b1", 0.0,
                                             "validating after reboot")
    assert engine.changed == {"GPU-2"}


def test_a_reboot_record_without_a_boot_id_waits() -> None:
    engine = RemediationEngine(ACT, [Record("GPU-2", 2, Phase.REBOOT, 2, 0.0, "")])
    assert engine.step([gpu()], 1.0, "b2") == []
    assert engine.records["GPU-2"].phase is Phase.REBOOT


def test_after_a_reboot_a_pass_releases_and_a_fail_latches_rma() -> None:
    engine = rebooting()
    engine.step([gpu()], 3.0, "b2")
    assert engine.verdict("GPU-2", True, "ok", 4.0, "b2") == [
        Log("GPU-2", 2, Step.RELEASED, "validation passed (after-reboot)")]
    assert engine.records == {} and engine.changed == {"GPU-2"}
    engine = rebooting()
    engine.step([gpu()], 3.0, "b2")
    reason = "r" * 300
    assert engine.verdict("GPU-2", False, reason, 4.0, "b2") == [
        Log("GPU-2", 2, Step.RMA, "validation failed after the reboot", reason[:200])]
    assert engine.records["GPU-2"] == Record(
        "GPU-2", 2, Phase.RMA, 1, 4.0, "b1", 0.0,
        f"validation failed after the reboot: {reason}"[:200])


def test_a_pass_after_reset_names_its_phase() -> None:
    engine = started()
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    assert engine.verdict("GPU-2", True, "ok", 2.0, "b1") == [
        Log("GPU-2", 2, Step.RELEASED, "validation passed (revalidating)")]


def test_verdicts_and_results_outside_their_phase_are_ignored() -> None:
    engine = started()
    assert engine.verdict("GPU-2", True, "ok", 1.0, "b1") == []
    assert engine.verdict("GPU-9", True, "ok", 1.0, "b1") == []
    assert engine.reset_done("GPU-9", True, "ok", 1.0, "b1") == []
    assert engine.reset_interrupted("GPU-9", 1.0) == []
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    assert engine.reset_interrupted("GPU-2", 2.0) == []
    assert engine.records["GPU-2"].phase is Phase.REVALIDATING


def test_a_reset_interrupted_by_a_restart_is_decided_by_validation() -> None:
    engine = started()
    assert engine.reset_interrupted("GPU-2", 7.0) == [
        Log("GPU-2", 2, Step.RESET_DONE, "agent restart",
            "the agent stopped during the reset: validation decides")]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.REVALIDATING, 0, 7.0, "", 0.0,
                                             "validating after reset")
    assert engine.changed == {"GPU-2"}


def test_a_reset_result_after_a_cancel_is_recorded_and_changes_nothing() -> None:
    for ok, step in ((True, Step.RESET_DONE), (False, Step.RESET_FAILED)):
        engine = started()
        engine.cancel(2, 1.0)
        assert engine.reset_done("GPU-2", ok, "d" * 300, 2.0, "b1") == [
            Log("GPU-2", 2, step, "the reset command", "d" * 200)]
        assert engine.records["GPU-2"].phase is Phase.CANCELLED


def test_healthy_again_releases_with_history_only_once_something_was_done() -> None:
    engine = RemediationEngine(ACT)
    engine.step([gpu(processes=1)], 0.0, "b1")
    engine.changed.clear()
    assert engine.step([gpu(state="healthy")], 1.0, "b1") == []
    assert engine.records == {} and engine.changed == {"GPU-2"}
    # A failed reset left a last reset: its release is history.
    engine = started(Settings(shadow=False, max_resets=5))
    engine.reset_done("GPU-2", False, "exit 1", 1.0, "b1")
    released = Log("GPU-2", 2, Step.RELEASED,
                   "healthy again (validated or released by an operator)")
    assert engine.step([gpu(state="healthy")], 2.0, "b1") == [released]
    # Released while revalidating: history, and the next GPU of the pass is still seen.
    engine = started()
    engine.reset_done("GPU-2", True, "ok", 1.0, "b1")
    assert engine.step([gpu(state="healthy"), gpu(3)], 2.0, "b1") == [
        released, Reset("GPU-3", 3, "00000000:03:00.0"),
        Log("GPU-3", 3, Step.RESET, ECC, "attempt 1")]
