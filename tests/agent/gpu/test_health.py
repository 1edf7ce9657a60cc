"""The GPU health engine, driven with hand-made snapshots and a fake clock."""

from __future__ import annotations

import dataclasses

import pytest

from agent.conditions import Action
from agent.gpu.health import GpuHealthEngine, GpuState
from agent.gpu.nvml import FIELDS, VERSIONS
from agent.gpu.observer import SAMPLES
from agent.gpu.settings import GpuObserverSection
from agent.gpu.types import (
    XID_EVENT,
    GpuCounters,
    GpuIdentity,
    GpuProcess,
    GpuSample,
    GpuSnapshot,
    GpuTelemetry,
    JobRef,
    NvmlEvent,
    gpu_class_of,
)
from harmonaize.messages import Urgency

pytestmark = pytest.mark.gpu

IDENTITY = GpuIdentity(0, "GPU-0", "NVIDIA H200", "00000000:18:00.0", 5, 16, 18)


def counters(**values: int) -> GpuCounters:
    base = dict.fromkeys(FIELDS, 0)
    base.update(values)
    reasons = base.pop("clocks_event_reasons", 0)
    return GpuCounters(base, reasons)


def telemetry(**values) -> GpuTelemetry:
    base = dict(temperature_c=40, power_w=300.0, power_limit_w=700.0, sm_clock_mhz=1900,
                max_sm_clock_mhz=1980, mem_clock_mhz=2600, util_gpu=90, util_mem=50,
                mem_total=141 << 30, mem_used=80 << 30, pcie_gen=5, pcie_width=16,
                nvlinks_up=18, processes=())
    base.update(values)
    return GpuTelemetry(**base)


READINGS: dict[str, int] = {}


def sample(c: GpuCounters | None = None, t: GpuTelemetry | None = None, *, lost: bool = False,
           hung: tuple[str, float] | None = None, xids: tuple[int, ...] = (),
           jobs: tuple[JobRef, ...] = (), index: int = 0,
           owners: dict[int, JobRef] | None = None) -> GpuSample:
    identity = dataclasses.replace(IDENTITY, index=index)
    snap = GpuSnapshot(identity, c or counters(), t or telemetry(), lost,
                       hung[0] if hung else None, hung[1] if hung else 0.0)
    # As a reader numbers them: the same readings keep their version.
    snap = dataclasses.replace(snap, version=READINGS.setdefault(repr(snap), next(VERSIONS)))
    events = tuple(NvmlEvent(index, XID_EVENT, x, 0.0) for x in xids)
    return GpuSample((snap,), events, {index: jobs} if jobs else {}, call_timeout=2.0,
                     seq=next(SAMPLES), owners=owners or {})


def engine(**cfg) -> GpuHealthEngine:
    return GpuHealthEngine(GpuObserverSection(**cfg))


def state(step) -> GpuState:
    return step.gpus[0].state


def test_a_healthy_gpu_stays_healthy() -> None:
    e = engine()
    for t in range(5):
        step = e.step(sample(), float(t))
    assert state(step) is GpuState.HEALTHY and step.action is Action.NONE
    assert step.counts.healthy == 1 and not step.advisories


def test_xid_13_of_the_gpus_only_job_is_the_applications_problem() -> None:
    e = engine()
    busy = telemetry(processes=(GpuProcess(100, 1 << 30),))
    e.step(sample(t=busy, jobs=(JobRef("job-1", "0"),), owners={100: JobRef("job-1", "0")}),
           0.0)
    step = e.step(sample(t=busy, xids=(13,), jobs=(JobRef("job-1", "0"),),
                         owners={100: JobRef("job-1", "0")}), 1.0)
    step = e.step(None, 3.5)  # no kernel line came: the GPU's only job is tied to it
    assert state(step) is GpuState.HEALTHY
    (event,) = [ev for ev in step.events if ev.reason == "ApplicationXid"]
    assert "xid 13" in event.message and "job-1" in event.message
    assert step.gpus[0].xid_count == 1 and step.counts.healthy == 1


def test_xid_13_tied_to_no_job_is_doubt_and_makes_the_gpu_suspect() -> None:
    e = engine()
    e.step(sample(), 0.0)
    e.step(sample(xids=(13,)), 1.0)
    step = e.step(None, 3.5)
    assert state(step) is GpuState.SUSPECT
    (event,) = [ev for ev in step.events if ev.reason == "Xid"]
    assert "xid 13" in event.message and "hardware" in event.message


def test_xid_79_loses_the_gpu_and_the_node_needs_a_reboot() -> None:
    e = engine()
    e.step(sample(), 0.0)
    step = e.step(sample(xids=(79,), jobs=(JobRef("job-1", "3"),)), 1.0)
    assert state(step) is GpuState.LOST and step.action is Action.REBOOT_NODE
    failure = {f.type: f for f in step.findings}["GpuFailure"]
    assert failure.holds and failure.reason == "NodeRebootRequired"
    assert failure.severity.value == "critical"
    (advisory,) = step.advisories
    assert (advisory.job, advisory.urgency, advisory.ranks) == ("job-1", Urgency.HIGH, ("3",))
    assert advisory.reason == "gpu-failure"


def test_a_repeated_identical_xid_is_a_new_event() -> None:
    e = engine()
    e.step(sample(), 0.0)
    step = e.step(sample(xids=(74, 74)), 1.0)
    assert len([ev for ev in step.events if ev.reason == "Xid"]) == 2
    assert step.gpus[0].xid_count == 2


def test_climbing_single_bit_errors_make_a_gpu_suspect() -> None:
    e = engine(sbe_per_minute=60)
    e.step(sample(counters(ecc_sbe_volatile=1000)), 0.0)  # old errors are the baseline
    assert state(e.step(sample(counters(ecc_sbe_volatile=1030)), 10.0)) is GpuState.HEALTHY
    step = e.step(sample(counters(ecc_sbe_volatile=1070)), 20.0)
    assert state(step) is GpuState.SUSPECT
    assert "70 single-bit ECC errors in the last minute" in step.gpus[0].why


def test_pending_row_remap_recommends_a_reset() -> None:
    e = engine()
    e.step(sample(), 0.0)
    step = e.step(sample(counters(remap_pending=1)), 1.0)
    assert state(step) is GpuState.SUSPECT and step.action is Action.RESET_GPU
    assert step.gpus[0].actions["RowRemapPending"] is Action.RESET_GPU


def test_a_new_double_bit_error_quarantines_and_latches() -> None:
    e = engine()
    e.step(sample(counters(ecc_dbe_volatile=0)), 0.0)
    step = e.step(sample(counters(ecc_dbe_volatile=1)), 1.0)
    assert state(step) is GpuState.QUARANTINED and step.action is Action.RESET_GPU
    assert "EccUncorrectable" in step.gpus[0].why
    for t in range(2, 2000, 100):  # the counter stops growing; the quarantine stays
        step = e.step(sample(counters(ecc_dbe_volatile=1)), float(t))
    assert state(step) is GpuState.QUARANTINED
    e.release(0, "operator", 3000.0)
    assert state(e.step(sample(counters(ecc_dbe_volatile=1)), 3001.0)) is GpuState.HEALTHY


def test_remap_failure_means_rma() -> None:
    e = engine()
    e.step(sample(), 0.0)
    step = e.step(sample(counters(remap_failure=1)), 1.0)
    assert state(step) is GpuState.QUARANTINED and step.action is Action.RMA


def test_a_hung_nvml_call_makes_the_gpu_unresponsive() -> None:
    e = engine()
    e.step(sample(), 0.0)
    assert state(e.step(sample(hung=("temperature", 1.0)), 1.0)) is GpuState.HEALTHY
    step = e.step(sample(hung=("temperature", 2.5)), 2.0)
    assert state(step) is GpuState.QUARANTINED
    assert "temperature has not returned for 2.5 s" in step.gpus[0].why


def test_a_gpu_that_fell_off_the_bus_is_lost() -> None:
    e = engine()
    step = e.step(sample(lost=True), 0.0)
    assert state(step) is GpuState.LOST and step.counts.lost == 1


def test_suspect_clears_only_after_a_quiet_period() -> None:
    e = engine(suspect_clear=600)
    e.step(sample(), 0.0)
    e.step(sample(counters(remap_pending=1)), 1.0)
    assert state(e.step(sample(), 2.0)) is GpuState.SUSPECT
    assert state(e.step(sample(), 500.0)) is GpuState.SUSPECT
    assert state(e.step(sample(counters(remap_pending=1)), 550.0)) is GpuState.SUSPECT
    assert state(e.step(sample(), 1100.0)) is GpuState.SUSPECT
    assert state(e.step(sample(), 1151.0)) is GpuState.HEALTHY


def test_pcie_replays_are_judged_by_link_generation() -> None:
    e = engine(pcie_replays_per_minute=8)
    e.step(sample(counters(pcie_replay=0), telemetry(pcie_gen=5)), 0.0)
    # Gen 5 allows 8 * 2^2 = 32 a minute.
    assert state(e.step(sample(counters(pcie_replay=30), telemetry(pcie_gen=5)), 30.0)) \
        is GpuState.HEALTHY
    e3 = engine(pcie_replays_per_minute=8)
    e3.step(sample(counters(pcie_replay=0), telemetry(pcie_gen=3)), 0.0)
    assert state(e3.step(sample(counters(pcie_replay=30), telemetry(pcie_gen=3)), 30.0)) \
        is GpuState.SUSPECT


def test_thermal_slowdown_must_be_sustained() -> None:
    e = engine(slowdown_sustain=10)
    hot = counters(clocks_event_reasons=0x40)
    e.step(sample(), 0.0)
    assert state(e.step(sample(hot), 1.0)) is GpuState.HEALTHY
    assert state(e.step(sample(hot), 8.0)) is GpuState.HEALTHY
    assert state(e.step(sample(), 9.0)) is GpuState.HEALTHY    # it cooled: restart
    assert state(e.step(sample(hot), 10.0)) is GpuState.HEALTHY
    assert state(e.step(sample(hot), 20.0)) is GpuState.SUSPECT


def test_link_degradation_but_not_an_idle_downshift() -> None:
    e = engine()
    idle = telemetry(pcie_gen=1, util_gpu=0)
    assert state(e.step(sample(t=idle), 0.0)) is GpuState.HEALTHY
    narrow = telemetry(pcie_width=8)
    step = e.step(sample(t=narrow), 1.0)
    assert state(step) is GpuState.SUSPECT and "width x8/x16" in step.gpus[0].why
    down = engine()
    step = down.step(sample(t=telemetry(nvlinks_up=16)), 0.0)
    assert state(step) is GpuState.SUSPECT and "16 of 18 NVLinks up" in step.gpus[0].why


def test_nvlink_recovery_and_the_driver_recovery_action() -> None:
    e = engine()
    e.step(sample(), 0.0)
    assert state(e.step(sample(counters(nvlink_recovery=1)), 1.0)) is GpuState.SUSPECT
    r = engine()
    r.step(sample(), 0.0)
    step = r.step(sample(counters(recovery_action=2)), 1.0)
    assert state(step) is GpuState.QUARANTINED and step.action is Action.REBOOT_NODE


def test_validation_hooks_move_the_state_machine() -> None:
    e = engine()
    e.step(sample(), 0.0)
    e.step(sample(counters(remap_pending=1)), 1.0)
    e.begin_validation(0, 2.0)
    step = e.step(sample(counters(remap_pending=1)), 3.0)
    assert state(step) is GpuState.VALIDATING and step.counts.validating == 1
    e.end_validation(0, passed=False, why="burn test 7% below baseline", now=4.0,
                     action=Action.RMA)
    step = e.step(sample(), 5.0)
    assert state(step) is GpuState.QUARANTINED and step.action is Action.RMA


def test_advisories_are_per_job_rate_limited_and_escalate() -> None:
    e = engine(advisory_interval=60)
    jobs = (JobRef("job-a", "0"), JobRef("job-b", None))
    e.step(sample(jobs=jobs), 0.0)
    step = e.step(sample(counters(remap_pending=1), jobs=jobs), 1.0)
    assert [(a.job, a.urgency) for a in step.advisories] == [
        ("job-a", Urgency.ELEVATED), ("job-b", Urgency.ELEVATED)]
    assert e.step(sample(counters(remap_pending=1), jobs=jobs), 2.0).advisories == []
    escalated = e.step(sample(counters(remap_pending=1, ecc_dbe_volatile=1), jobs=jobs), 3.0)
    assert [(a.job, a.urgency) for a in escalated.advisories] == [
        ("job-a", Urgency.HIGH), ("job-b", Urgency.HIGH)]
    assert escalated.advisories[0].reason == "gpu-memory"
    assert e.step(sample(jobs=jobs), 30.0).advisories == []
    assert len(e.step(sample(jobs=jobs), 64.0).advisories) == 2  # still quarantined: remind


def test_advisories_name_only_the_job_its_ranks_and_a_reason_class() -> None:
    e = engine()
    e.step(sample(jobs=(JobRef("j", "7"),)), 0.0)
    (advisory,) = e.step(sample(counters(ecc_dbe_volatile=3), jobs=(JobRef("j", "7"),)),
                         1.0).advisories
    text = repr(advisory)
    for secret in ("GPU-0", "00000000:18:00.0", "H200", "ecc", "dbe"):
        assert secret not in text


def test_gpu_class_from_the_model_name() -> None:
    assert gpu_class_of("NVIDIA H200") == "H200"
    assert gpu_class_of("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert gpu_class_of("Tesla V100-SXM2-32GB") == "V100-SXM2-32GB"
    assert gpu_class_of("") == "unknown"


def test_a_pass_acknowledges_old_evidence_but_not_new() -> None:
    e = engine(sbe_per_minute=60)
    e.step(sample(counters(ecc_sbe_volatile=0)), 0.0)
    assert state(e.step(sample(counters(ecc_sbe_volatile=100)), 1.0)) is GpuState.SUSPECT
    e.begin_validation(0, 2.0)
    e.end_validation(0, passed=True, why="burn test passed", now=3.0)
    # The same hundred errors, still inside the minute: already judged.
    assert state(e.step(sample(counters(ecc_sbe_volatile=100)), 4.0)) is GpuState.HEALTHY
    assert state(e.step(sample(counters(ecc_sbe_volatile=120)), 5.0)) is GpuState.HEALTHY
    # Errors that keep coming after the pass count again.
    assert state(e.step(sample(counters(ecc_sbe_volatile=200)), 6.0)) is GpuState.SUSPECT
