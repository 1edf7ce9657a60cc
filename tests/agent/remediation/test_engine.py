"""The remediation engine on its own (sans-I/O): its table, its limits, its escalation."""

from __future__ import annotations

import pytest

from agent.remediation.engine import TRANSITIONS, Event, RemediationEngine
from agent.remediation.types import (
    GpuSeen,
    Log,
    Phase,
    Record,
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


# --- Each move pinned down exactly: the actions, the record, what is to persist ------------

ECC = "EccUncorrectable"
BUS = "00000000:02:00.0"


def started(settings: Settings = ACT) -> RemediationEngine:
    """An engine whose GPU 2 is being reset (started at 0.0 in boot b1)."""
    engine = RemediationEngine(settings)
    engine.step([gpu()], 0.0, "b1")
    engine.changed.clear()
    return engine


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


def test_reasons_a_waiting_gpu_is_not_reset() -> None:
    engine = RemediationEngine(ACT, [Record("GPU-2", 2, Phase.WAITING)])
    cases = [(gpu(state="suspect"), "waiting: the GPU is suspect"),
             (gpu(action="drain"), "waiting: the recommended action is now drain"),
             (gpu(processes=None), "waiting: its processes could not be read"),
             (gpu(processes=3), "waiting: in use by 3 process(es)")]
    for seen, why in cases:
        engine.changed.clear()
        assert engine.step([seen], 1.0, "b1") == []
        assert engine.records["GPU-2"].detail == why and engine.changed == {"GPU-2"}
        engine.changed.clear()
        engine.step([seen], 2.0, "b1")
        assert engine.changed == set()  # the same reason: nothing new to persist
    assert engine.next_deadline() == float("inf")


def test_per_gpu_interval_at_its_boundary_and_the_deadline() -> None:
    engine = RemediationEngine(ACT, [Record("GPU-2", 2, Phase.WAITING, 1, 0.0, "", 100.0)])
    assert engine.step([gpu()], 699.5, "b1") == []
    assert engine.records["GPU-2"].detail == "rate limit: this GPU's next reset at 700"
    assert engine.next_deadline() == 700.0
    assert resets(engine.step([gpu()], 700.0, "b1")) == [Reset("GPU-2", 2, BUS)]
    assert engine.next_deadline() == float("inf")


def test_hourly_limit_at_its_boundary_and_the_deadline() -> None:
    limit = Settings(shadow=False, reset_interval=0.0, max_resets_per_hour=2)
    engine = RemediationEngine(limit, resets=[500.0, 100.0])
    assert engine.resets == [100.0, 500.0]  # oldest first
    assert engine.step([gpu()], 3699.0, "b1") == []
    assert engine.records["GPU-2"].detail == \
        "rate limit: 2 resets on this host within the hour"
    assert engine.next_deadline() == 3700.0
    assert resets(engine.step([gpu()], 3700.0, "b1")) == [Reset("GPU-2", 2, BUS)]
    assert engine.resets == [500.0, 3700.0]
    engine = RemediationEngine(limit, resets=[100.0])
    assert len(resets(engine.step([gpu()], 200.0, "b1"))) == 1  # one of two: allowed


def test_the_earliest_deadline_of_several_held_gpus() -> None:
    engine = RemediationEngine(ACT, [Record("GPU-2", 2, Phase.WAITING, 1, 0.0, "", 300.0),
                                     Record("GPU-3", 3, Phase.WAITING, 1, 0.0, "", 100.0)])
    engine.step([gpu(2), gpu(3)], 200.0, "b1")
    assert engine.next_deadline() == 700.0


def test_shadow_would_names_the_gpu_and_why_and_resets_nothing() -> None:
    engine = RemediationEngine(Settings(shadow=True))
    assert engine.step([gpu()], 0.0, "b1") == [Would(2, f"reset ({BUS}): {ECC}")]
    assert engine.records["GPU-2"] == Record("GPU-2", 2, Phase.WAITING, 0, 0.0, "",
                                             float("-inf"), f"shadow: would reset gpu 2 ({BUS})")
    assert engine.changed == {"GPU-2"}
    engine.changed.clear()
    engine.step([gpu()], 1.0, "b1")
    assert engine.changed == set()


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
