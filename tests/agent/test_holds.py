"""The reasons a host gives its scheduler for taking no new work (``HostSummary.holds``)."""

from __future__ import annotations

import pytest

from agent.conditions import Action
from agent.gpu.health import GpuState, GpuView
from agent.step import holds_of
from harmonaize.messages import (
    Condition,
    Health,
    Hold,
    HoldKind,
    HostSummary,
    Severity,
    Status,
    WireError,
    decode,
    encode,
)

pytestmark = pytest.mark.scheduler


def _gpu(index: int, state: GpuState, action: Action = Action.NONE) -> GpuView:
    return GpuView(index, f"GPU-{index}", "fake", state, "", 0.0, action, (), {}, (), 0, None)


def test_a_healthy_host_has_no_holds() -> None:
    gpus = [_gpu(0, GpuState.HEALTHY), _gpu(1, GpuState.SUSPECT), _gpu(2, GpuState.VALIDATING)]
    warning = Condition("GpuSuspect", Status.TRUE, severity=Severity.WARNING)
    assert holds_of(None, gpus, None, [warning]) == ()


def test_each_reason_to_take_no_work_is_one_hold_naming_its_gpu_and_action() -> None:
    gpus = [_gpu(0, GpuState.HEALTHY), _gpu(2, GpuState.QUARANTINED, Action.RESET_GPU),
            _gpu(3, GpuState.LOST, Action.REBOOT_NODE)]
    conditions = [Condition("GpuFailure", Status.TRUE, severity=Severity.CRITICAL),
                  Condition("EccUncorrectable", Status.FALSE, severity=Severity.CRITICAL)]
    holds = holds_of("rack maintenance", gpus, "nccl-allreduce below baseline", conditions)
    assert holds == (
        Hold(HoldKind.DRAINED, -1, "rack maintenance"),
        Hold(HoldKind.GPU_QUARANTINED, 2, "reset-gpu"),
        Hold(HoldKind.GPU_LOST, 3, "reboot-node"),
        Hold(HoldKind.VALIDATION_FAILED, -1, "nccl-allreduce below baseline"),
        Hold(HoldKind.CONDITION, -1, "GpuFailure"),
    )


def test_holds_cross_the_wire_and_bad_ones_are_refused() -> None:
    summary = HostSummary(health=Health.UNHEALTHY, schedulable=True,
                          holds=(Hold(HoldKind.GPU_QUARANTINED, 2, "reset-gpu"),))
    assert decode(encode(summary, sender="h1")).body.holds == summary.holds
    bad = HostSummary(health=Health.HEALTHY, schedulable=True,
                      holds=(Hold("nonsense", 2, "reset-gpu"),))  # type: ignore[arg-type]
    with pytest.raises(WireError, match="kind"):
        decode(encode(bad, sender="h1"))
