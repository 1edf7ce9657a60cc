"""Why a waiting GPU is not reset: the limits at their boundaries, their deadlines, shadow mode."""

from __future__ import annotations

import pytest

from agent.remediation.engine import RemediationEngine
from agent.remediation.types import Phase, Record, Reset, Settings, Would
from tests.agent.remediation.test_engine import ACT, BUS, ECC, gpu, resets

pytestmark = pytest.mark.scheduler


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
