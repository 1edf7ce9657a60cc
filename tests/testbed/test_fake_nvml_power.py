"""The fake NVML's power limits, through the real pynvml: constraints, the set call, its
refusals, a GPU that ignores it, and the documented limit -> clock -> throughput curve."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pynvml
import pytest

from testbed import fakegpu
from testbed.fakegpu import FakeNvml

pytestmark = pytest.mark.energy

ROOT = Path(__file__).resolve().parents[2]
W = 1000  # mW


@pytest.fixture(scope="module", autouse=True)
def library() -> ctypes.CDLL:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "fake_nvml")], check=True)
    return fakegpu.preload()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeNvml]:
    with tempfile.TemporaryDirectory(prefix="hz-fake-power-") as name:
        state = FakeNvml(Path(name) / "nvml.state", gpus=2)
        # A busy GPU: 600 W at 1980 MHz unconstrained, 100 W of it static.
        state.set(0, power_mw=600 * W, clock_sm_mhz=1980, clock_graphics_mhz=1980,
                  power_static_mw=100 * W, util_gpu=100, clocks_event_reasons=0)
        monkeypatch.setenv(fakegpu.STATE_ENV, str(state.path))
        pynvml.nvmlInit()
        yield state
        with contextlib.suppress(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlShutdown()


def handle(index: int = 0) -> pynvml.c_nvmlDevice_t:
    return pynvml.nvmlDeviceGetHandleByIndex(index)


def curve(limit_w: float, demand_w: float = 600, static_w: float = 100,
          share: float = 1.0) -> tuple[float, float]:
    """The documented curve (native/fake_nvml/power.c): clock ratio and throughput."""
    ratio = ((limit_w - static_w) / (demand_w - static_w)) ** (1 / 3)
    return ratio, 1 / (share / ratio + 1 - share)


def test_constraints_and_default_limit_are_an_h200s(fake: FakeNvml) -> None:
    h = handle()
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(h) == [200 * W, 700 * W]
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(h) == 700 * W
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 700 * W
    fake.set(1, power_min_mw=150 * W, power_max_mw=500 * W, power_default_mw=450 * W)
    assert pynvml.nvmlDeviceGetPowerManagementLimitConstraints(handle(1)) == [150 * W, 500 * W]
    assert pynvml.nvmlDeviceGetPowerManagementDefaultLimit(handle(1)) == 450 * W


def test_a_limit_below_the_demand_slows_the_gpu_along_the_curve(fake: FakeNvml) -> None:
    h = handle()
    assert fakegpu.throughput(h) == 1.0
    assert pynvml.nvmlDeviceGetPowerUsage(h) == 600 * W
    pynvml.nvmlDeviceSetPowerManagementLimit(h, 400 * W)
    ratio, throughput = curve(400)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(h) == 400 * W
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h) == 400 * W
    assert pynvml.nvmlDeviceGetPowerUsage(h) == pytest.approx(400 * W, abs=2)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM) == round(1980 * ratio)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_GRAPHICS) == round(1980 * ratio)
    assert pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM) == 3201  # not the SM's
    assert fakegpu.throughput(h) == pytest.approx(throughput, abs=1e-6)
    # The software power cap is the reason, which the health engine does not count as a
    # slowdown (only thermal and hardware reasons are).
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) & 0x4
    assert fake.set_limits() == {0: 400 * W}
    # The other GPU is untouched.
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle(1)) == 700 * W


def test_a_memory_bound_share_loses_less_throughput(fake: FakeNvml) -> None:
    fake.set(0, compute_share=40)
    pynvml.nvmlDeviceSetPowerManagementLimit(handle(), 300 * W)
    assert fakegpu.throughput(handle()) == pytest.approx(curve(300, share=0.4)[1], abs=1e-6)
    assert fakegpu.throughput(handle()) > curve(300)[1]


def test_lower_limits_never_give_more_throughput_or_draw(fake: FakeNvml) -> None:
    h = handle()
    seen = []
    for watts in range(700, 195, -25):
        pynvml.nvmlDeviceSetPowerManagementLimit(h, max(watts, 200) * W)
        seen.append((fakegpu.throughput(h), pynvml.nvmlDeviceGetPowerUsage(h),
                     pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)))
    assert seen == sorted(seen, reverse=True)
    assert seen[0] == (1.0, 600 * W, 1980) and seen[-1][0] < 0.8


def test_the_lowest_clock_bounds_the_slowdown_and_the_draw_stays_above_the_limit(
        fake: FakeNvml) -> None:
    fake.set(0, min_clock_sm_mhz=1200)
    pynvml.nvmlDeviceSetPowerManagementLimit(handle(), 200 * W)
    assert pynvml.nvmlDeviceGetClockInfo(handle(), pynvml.NVML_CLOCK_SM) == 1200
    assert pynvml.nvmlDeviceGetPowerUsage(handle()) > 200 * W


def test_limits_outside_the_constraints_are_refused(fake: FakeNvml) -> None:
    for watts in (199, 701, 0):
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceSetPowerManagementLimit(handle(), watts * W)
    assert fake.set_limits() == {}


def test_without_permission_the_set_is_refused(fake: FakeNvml) -> None:
    fake.set(0, power_settable=0)
    with pytest.raises(pynvml.NVMLError_NoPermission):
        pynvml.nvmlDeviceSetPowerManagementLimit(handle(), 400 * W)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle()) == 700 * W
    assert fake.set_limits() == {}


def test_a_gpu_that_ignores_the_call_says_success_and_keeps_its_limit(fake: FakeNvml) -> None:
    fake.set(0, power_ignores=1)
    pynvml.nvmlDeviceSetPowerManagementLimit(handle(), 400 * W)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle()) == 700 * W
    assert fakegpu.throughput(handle()) == 1.0


def test_a_hung_set_call_blocks_like_any_other(fake: FakeNvml) -> None:
    fake.hang(0, "nvmlDeviceSetPowerManagementLimit")
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(pynvml.nvmlDeviceSetPowerManagementLimit, handle(), 500 * W)
        assert pynvml.nvmlDeviceGetPowerUsage(handle()) == 600 * W  # other calls go on
        assert fake.set_limits() == {} and not pending.done()
        fake.release(0)
        pending.result(timeout=30)
    assert fake.set_limits() == {0: 500 * W}


def test_a_set_limit_is_the_gpus_for_every_process_until_reset(fake: FakeNvml) -> None:
    pynvml.nvmlDeviceSetPowerManagementLimit(handle(), 450 * W)
    probe = ("import json, pynvml; pynvml.nvmlInit(); h = pynvml.nvmlDeviceGetHandleByIndex(0);"
             "print(json.dumps([pynvml.nvmlDeviceGetPowerManagementLimit(h),"
             " pynvml.nvmlDeviceGetPowerUsage(h)]))")
    env = {**os.environ, **fakegpu.environment(fake.path)}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert json.loads(out)[0] == 450 * W
    # Writing the state again (a test changing something else) keeps the set limit.
    fake.set(1, temperature=50)
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle()) == 450 * W
    fake.reset_power_limits()
    assert pynvml.nvmlDeviceGetPowerManagementLimit(handle()) == 700 * W
    assert pynvml.nvmlDeviceGetPowerUsage(handle()) == 600 * W
