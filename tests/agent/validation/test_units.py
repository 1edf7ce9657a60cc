"""Validation pieces without processes: the baseline rule, parsers, static checks, planner."""

from __future__ import annotations

import json
import threading

import pytest

from agent.conditions import Action
from agent.gpu.nvml import FIELDS
from agent.gpu.types import GpuCounters, GpuIdentity, GpuSnapshot, GpuTelemetry, JobRef
from agent.validation import baseline
from agent.validation.checks import (
    CheckResult,
    Measurement,
    Outcome,
    StaticLimits,
    Target,
    parse_dcgmi_json,
    parse_iperf3,
    parse_metrics,
    parse_nccl_tests,
    static_checks,
)
from agent.validation.history import History
from agent.validation.planner import Device, Planner, PlannerSettings

pytestmark = pytest.mark.validation


@pytest.mark.parametrize(
    ("value", "passes"),
    [(100.0, True), (96.0, True), (95.5, True), (94.0, False), (60.0, False), (120.0, True)],
)
def test_more_than_five_percent_below_the_baseline_fails(value: float, passes: bool) -> None:
    ok, why = baseline.judge(value, 100.0)
    assert ok is passes
    if not passes:
        assert "below its baseline 100" in why


def test_lower_is_better_and_no_baseline() -> None:
    assert baseline.judge(106.0, 100.0, higher_is_better=False)[0] is False
    assert baseline.judge(104.0, 100.0, higher_is_better=False)[0] is True
    assert baseline.judge(1.0, None) == (True, "no baseline yet")


def test_learned_baselines_are_the_median_of_recent_passes() -> None:
    assert baseline.learned([]) is None
    assert baseline.learned([10.0, 100.0, 101.0, 99.0, 98.0, 102.0]) == 100.0
    assert baseline.learned([float("nan"), 50.0]) == 50.0


def test_metric_lines_are_parsed_and_bad_output_is_an_error() -> None:
    outcome, _, measured = parse_metrics("noise\nmetric gflops 931.5 GFLOP/s\n"
                                         "metric -latency_us 12\nmetric bad nan\n", 0)
    assert outcome is Outcome.PASS
    assert [(m.name, m.value, m.unit, m.higher_is_better) for m in measured] == [
        ("gflops", 931.5, "GFLOP/s", True), ("latency_us", 12.0, "", False)]
    assert parse_metrics("nothing useful", 0)[0] is Outcome.ERROR
    assert parse_metrics("metric x 1", 3)[0] is Outcome.FAIL


def test_nccl_tests_dcgmi_and_iperf3_output() -> None:
    nccl = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 187.42 \n"
    outcome, _, measured = parse_nccl_tests(nccl, 0)
    assert outcome is Outcome.PASS and measured[0].value == 187.42
    assert parse_nccl_tests("# Out of bounds values : 3 FAILED\n# Avg bus bandwidth : 1\n",
                            0)[0] is Outcome.FAIL
    report = {"DCGM GPU Diagnostic": {"test_categories": [{"tests": [
        {"name": "Memory", "results": [{"status": "Pass"}]},
        {"name": "PCIe", "results": [{"status": "Fail"}]}]}]}}
    outcome, why, _ = parse_dcgmi_json(json.dumps(report), 226)
    assert outcome is Outcome.FAIL and "PCIe" in why
    assert parse_dcgmi_json("dcgmi: command not found", 127)[0] is Outcome.FAIL
    iperf = {"end": {"sum_received": {"bits_per_second": 9.4e9}}}
    outcome, _, measured = parse_iperf3(json.dumps(iperf), 0)
    assert outcome is Outcome.PASS and measured[0].value == pytest.approx(9.4)
    assert parse_iperf3("{}", 1)[0] is Outcome.ERROR


def snapshot(reasons: int = 0, **counters: int) -> GpuSnapshot:
    values = dict.fromkeys(FIELDS, 0)
    values.update(counters)
    identity = GpuIdentity(0, "GPU-0", "NVIDIA H200", "0:18:0", 5, 16, 18)
    telemetry = GpuTelemetry(40, 300.0, 700.0, 1900, 1980, 2600, 10, 5, 1, 1, 5, 16, 18)
    return GpuSnapshot(identity, GpuCounters(values, reasons), telemetry)


def test_static_checks() -> None:
    limits = StaticLimits(retired_pages_limit=60)
    healthy = static_checks(Target(0, snapshot()), limits)
    assert {r.check for r in healthy} == {"memory-repair", "pcie-link", "nvlink", "clocks",
                                         "recovery-action"}
    assert all(r.outcome is Outcome.PASS for r in healthy)
    pending = {r.check: r for r in static_checks(Target(0, snapshot(remap_pending=1)), limits)}
    assert pending["memory-repair"].outcome is Outcome.FAIL
    assert pending["memory-repair"].action is Action.RESET_GPU
    failed = {r.check: r for r in static_checks(Target(0, snapshot(remap_failure=1)), limits)}
    assert failed["memory-repair"].action is Action.RMA
    driver = {r.check: r for r in static_checks(Target(0, snapshot(recovery_action=2)), limits)}
    assert driver["recovery-action"].action is Action.REBOOT_NODE
    assert static_checks(Target(0, None), limits)[0].outcome is Outcome.ERROR
    capped = {r.check: r for r in static_checks(Target(0, snapshot(reasons=0x4)), limits)}
    assert capped["clocks"].outcome is Outcome.PASS  # a software power cap is policy
    brake = {r.check: r for r in static_checks(Target(0, snapshot(reasons=0x80)), limits)}
    assert brake["clocks"].outcome is Outcome.FAIL and brake["clocks"].action is Action.DRAIN


def planner(**settings) -> Planner:
    return Planner(PlannerSettings(**{"cooldown": 100.0, "notice_lead": 10.0, **settings}),
                   lambda key, level: 60.0)


def gpu(index: int, state: str, jobs: tuple[JobRef, ...] = (), repaired: bool = False) -> Device:
    return Device(f"gpu:{index}", index, state, jobs, repaired)


def step(p: Planner, devices: list[Device], now: float, running: set[str] = frozenset(),
         last_done: dict | None = None, allowance=lambda job: 0.0):
    return p.step(devices, now, running=set(running), last_done=last_done or {},
                  allowance=allowance)


def test_a_suspect_gpu_is_validated_and_cooldowns_hold() -> None:
    p = planner()
    starts, told = step(p, [gpu(0, "healthy"), gpu(1, "suspect")], 0.0)
    assert [(s.key, s.trigger) for s in starts] == [("gpu:1", "suspect")] and told == []
    assert step(p, [gpu(1, "suspect")], 50.0, last_done={"gpu:1": 0.0})[0] == []
    assert [s.key for s in step(p, [gpu(1, "suspect")], 101.0,
                                last_done={"gpu:1": 0.0})[0]] == ["gpu:1"]


def test_one_at_a_time_per_device_and_a_limit_in_all() -> None:
    p = planner(max_parallel=2)
    devices = [gpu(i, "suspect") for i in range(4)]
    assert step(p, devices, 0.0, running={"gpu:0"})[0][0].key == "gpu:1"
    assert len(step(p, devices, 0.0, running={"gpu:0"})[0]) == 1


def test_a_tenants_gpu_waits_unless_its_job_allows_the_pause() -> None:
    p = planner()
    busy = gpu(2, "suspect", (JobRef("job-a", "5"), JobRef("job-a", "6")))
    starts, told = step(p, [busy], 0.0, allowance=lambda job: 30.0)
    assert starts == [] and told == []
    assert "does not allow a 60 s pause" in p.waiting["gpu:2"]
    starts, told = step(p, [busy], 1.0, allowance=lambda job: 120.0)
    assert starts == [] and told[0].notices == (("job-a", ("5", "6")),)
    assert told[0].start_at == 11.0 and told[0].pause == 60.0
    assert step(p, [busy], 5.0, allowance=lambda job: 120.0) == ([], [])
    starts, _ = step(p, [busy], 11.0, allowance=lambda job: 120.0)
    assert [s.key for s in starts] == ["gpu:2"]


def test_a_job_that_withdraws_its_allowance_is_not_paused() -> None:
    p = planner()
    busy = gpu(2, "suspect", (JobRef("job-a"),))
    (plan,) = step(p, [busy], 0.0, allowance=lambda job: 120.0)[1]
    assert step(p, [busy], 10.0, allowance=lambda job: 0.0)[0] == []
    assert p.take_cancelled() == [plan] and p.take_cancelled() == []  # its jobs are told


@pytest.mark.tenant
def test_answers_start_a_shared_gpu_only_when_every_job_approved() -> None:
    p = planner(notice_lead=100.0)
    shared = gpu(2, "suspect", (JobRef("job-a", "1"), JobRef("job-b", "7")))
    (plan,) = step(p, [shared], 0.0, allowance=lambda job: 120.0)[1]
    assert plan.id == "v-1" and plan.jobs == ("job-a", "job-b") and plan.start_at == 100.0
    assert p.answer("v-9", "job-a", 1.0, approve=True)[0] is None  # no such plan
    assert p.answer(plan.id, "job-c", 1.0, approve=True)[0] is None  # not told of it
    # One job's approval is not enough; the other one defers, within its allowance.
    assert p.answer(plan.id, "job-a", 1.0, approve=True)[0].start_at == 100.0
    moved, why = p.answer(plan.id, "job-b", 2.0, defer=900.0, max_defer=300.0)
    assert moved.start_at == 400.0 and why == "deferred by 300 s"
    assert p.answer(plan.id, "job-b", 3.0, defer=10.0, max_defer=300.0)[0] is None  # once
    assert p.answer(plan.id, "job-a", 3.0, defer=10.0)[1] == \
        "job job-a's declaration allows no deferral"
    assert step(p, [shared], 50.0, allowance=lambda job: 120.0) == ([], [])
    started, _ = p.answer(plan.id, "job-b", 60.0, approve=True)
    assert started.start_at == 60.0 and started.approved == {"job-a", "job-b"}
    assert [s.key for s in step(p, [shared], 60.0, allowance=lambda job: 120.0)[0]] == ["gpu:2"]


def test_operators_skip_cooldowns_and_repairs_are_revalidated() -> None:
    p = planner()
    p.request("gpu:0", 3)
    (start,) = step(p, [gpu(0, "healthy")], 10.0, last_done={"gpu:0": 5.0})[0]
    assert (start.level, start.trigger) == (3, "operator")
    (again,) = step(p, [gpu(1, "quarantined", repaired=True)], 10.0,
                    last_done={"gpu:1": 9.0})[0]
    assert again.trigger == "after-repair"
    assert step(p, [gpu(1, "quarantined")], 10.0)[0] == []


def test_the_schedule_uses_idle_windows_only() -> None:
    p = planner(schedule_interval=1000.0)
    idle, busy = gpu(0, "healthy"), gpu(1, "healthy", (JobRef("j"),))
    starts, _ = step(p, [idle, busy], 5000.0, allowance=lambda job: 1e9)
    assert [(s.key, s.trigger) for s in starts] == [("gpu:0", "schedule")]
    assert step(p, [idle], 5500.0, last_done={"gpu:0": 5000.0})[0] == []


def test_history_keeps_every_result_when_validations_finish_together(tmp_path) -> None:
    """Runner threads finish validations at the same moment on one connection."""
    history = History(tmp_path / "history.db")
    result = CheckResult("burn", Outcome.PASS, "ok", (Measurement("gflops", 100.0),))
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def validate(gpu: int) -> None:
        try:
            barrier.wait()
            for _ in range(40):
                run = history.begin(f"gpu:{gpu}", f"GPU-{gpu}", 2, "operator", now=1.0)
                history.finish(run, "pass", "ok", "none", results=[result, result], now=2.0)
                history.passing_values(f"GPU-{gpu}", "burn", "gflops")
        except BaseException as exc:  # reported below, with the rows
            errors.append(exc)

    threads = [threading.Thread(target=validate, args=(gpu,)) for gpu in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rows = history.recent(limit=1000)
    history.close()
    assert not errors, errors
    assert len(rows) == 160 and all(r["finished"] == 2.0 for r in rows)
    assert all(len(r["checks"]) == 2 for r in rows)
