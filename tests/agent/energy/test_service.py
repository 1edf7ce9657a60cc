"""The energy loop's shell through the real pynvml and the fake NVML: limits set and read
back, what the ranks' stats files say, refusals, a GPU that ignores the call, a hung call,
the originals on disk, and what a crashed run left put back.

Time is simulated (the loop takes ``now``); every NVML call and stats file is real. The
ranks' progress follows the fake GPUs' own throughput under their limits
(native/fake_nvml/power.c), so what the loop measures is what its limits did.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml
import pytest

from agent.energy.service import ENERGY_FILE, EnergyService
from agent.energy.settings import EnergySection
from agent.gpu.types import GpuIdentity, GpuProcess, GpuSample, GpuSnapshot, GpuTelemetry, JobRef
from agent.plugin.shm import prepare_dirs, prepare_job_dir
from harmonaize.messages import EnergyAllowance, JobDeclaration
from testbed import fakegpu
from testbed.fakegpu import FakeNvml
from tests.daemons import wait_until
from tests.energyplant import StatsFile

pytestmark = pytest.mark.energy

ROOT = Path(__file__).resolve().parents[3]
W = 1000
JOB = "job-1"
CFG = EnergySection(interval=1.0, settle=2.0, window=5.0, hold=600.0, rebaseline=0.0,
                    max_changes_per_minute=10)


@pytest.fixture(scope="module", autouse=True)
def library() -> ctypes.CDLL:
    subprocess.run(["make", "-s", "-C", str(ROOT / "native" / "fake_nvml")], check=True)
    return fakegpu.preload()


@dataclass
class Host:
    """Four fake GPUs running one job's ranks, and the energy service over them."""

    directory: Path
    fake: FakeNvml
    handles: dict[str, Any]
    uuids: list[str]
    stats: list[StatsFile]
    speeds: list[float]
    declaration: JobDeclaration
    t: float = 0.0
    progress: float = 0.0
    base_rate: float = 50.0
    services: list[EnergyService] = field(default_factory=list)

    def service(self, cfg: EnergySection = CFG, call_timeout: float = 2.0) -> EnergyService:
        service = EnergyService(cfg, self.directory / "state", lambda: self.handles,
                                call_timeout=call_timeout, policy_dir=self.directory / "tuner")
        service.restore_left()
        service.start()
        self.services.append(service)
        return service

    def throughputs(self) -> list[float]:
        return [fakegpu.throughput(self.handles[u]) for u in self.uuids]

    def pace(self) -> float:
        return self.base_rate * min(s * t for s, t in zip(self.speeds, self.throughputs(),
                                                          strict=True))

    def sample(self) -> GpuSample:
        snaps = []
        for i, uuid in enumerate(self.uuids):
            h = self.handles[uuid]
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
            snaps.append(GpuSnapshot(
                GpuIdentity(i, uuid, "NVIDIA H200", "", 5, 16, 18), None, GpuTelemetry(
                    40, pynvml.nvmlDeviceGetPowerUsage(h) / W,
                    pynvml.nvmlDeviceGetEnforcedPowerLimit(h) / W,
                    pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM), 1980,
                    pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM), util.gpu,
                    util.memory, None, None, 5, 16, 18, (GpuProcess(PIDS[i], 1 << 30),))))
        return GpuSample(tuple(snaps), (), {i: (JobRef(JOB, str(i)),)
                                             for i in range(len(self.uuids))})

    def run(self, service: EnergyService, seconds: float, declared: bool = True,
            out_of_service: tuple[int, ...] = ()) -> None:
        """Simulated seconds: ranks progress at the GPUs' pace, the service looks each
        second, and its NVML calls land before time moves on."""
        end = self.t + seconds
        while self.t < end:
            pace = [s * t for s, t in zip(self.speeds, self.throughputs(), strict=True)]
            slowest = min(pace)
            self.progress += self.pace()
            for stats, p in zip(self.stats, pace, strict=True):
                stats.set(int(self.progress) + (0 if p == slowest else 1))
            service.step(self.sample(), {JOB: self.declaration} if declared else {}, self.t,
                         out_of_service)
            wait_until(service.control.idle, what="the NVML calls")
            self.t += 1.0

    def limits(self) -> list[int]:
        return [pynvml.nvmlDeviceGetPowerManagementLimit(self.handles[u]) // W
                for u in self.uuids]

    def originals_file(self) -> Path:
        return self.directory / "state" / ENERGY_FILE


PIDS = [41001, 41002, 41003, 41004]


@pytest.fixture
def host(monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    with tempfile.TemporaryDirectory(prefix="hz-energy-") as name:
        directory = Path(name)
        (directory / "state").mkdir()
        fake = FakeNvml(directory / "nvml.state", gpus=4)
        for i in range(4):
            fake.set(i, power_mw=600 * W, clock_sm_mhz=1980, clock_graphics_mhz=1980,
                     power_static_mw=100 * W, util_gpu=100, clocks_event_reasons=0,
                     processes={PIDS[i]: 1 << 30})
        monkeypatch.setenv(fakegpu.STATE_ENV, str(fake.path))
        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
        uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
        prepare_dirs(directory / "tuner")
        prepare_job_dir(directory / "tuner", JOB, None)
        stats = [StatsFile(directory / "tuner", JOB, pid, comm=7, n_ranks=4) for pid in PIDS]
        h = Host(directory, fake, dict(zip(uuids, handles, strict=True)), uuids, stats,
                 [1.0] * 4, JobDeclaration(JOB, energy=EnergyAllowance(0.06)))
        try:
            yield h
        finally:
            for service in h.services:
                service.control.stop()
            for s in stats:
                s.close()
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()


def test_it_lowers_the_limits_through_nvml_and_the_job_stays_within_its_slack(host) -> None:
    service = host.service()
    host.run(service, 200)
    # 560 W: 2.7% slower on the fake's curve; 525 W was tried (5.3%: near 6%) and undone.
    assert host.limits() == [560] * 4
    assert host.fake.set_limits() == dict.fromkeys(range(4), 560 * W)
    assert 1 - host.pace() / host.base_rate < 0.8 * 0.06
    view = service.view()
    (job,) = view["jobs"]
    assert job["progress"] == "collectives" and job["phase"] == "hold"
    assert job["baseline_per_s"] == pytest.approx(4 * host.base_rate, rel=0.02)
    assert job["saved_kj"] > 0 and 0 < job["saved_share"] < 0.15
    gpu = view["gpus"][0]
    assert (gpu["state"], gpu["limit_w"], gpu["set_w"], gpu["original_w"]) == (
        "lowered", 560, 560, 700)
    assert gpu["draw_w"] == pytest.approx(560, abs=1) and gpu["saved_kj"] > 0
    # The originals are on disk while the GPUs are lowered.
    saved = json.loads(host.originals_file().read_text())["gpus"]
    assert {u: g["original_mw"] for u, g in saved.items()} == dict.fromkeys(host.uuids, 700 * W)
    service.stop()
    assert host.limits() == [700] * 4 and not host.originals_file().exists()


def test_the_constraint_and_the_tenants_floor_bound_the_limits(host) -> None:
    host.fake.set(3, power_min_mw=580 * W)  # NVML's own range for GPU 3
    host.declaration = JobDeclaration(JOB, energy=EnergyAllowance(0.5, min_watts=500))
    service = host.service()
    host.run(service, 300)
    limits = host.limits()
    assert limits[3] == 580 and min(limits[:3]) == 500
    assert service.view()["gpus"][3]["floor_w"] == 580


def test_the_declaration_withdrawn_puts_every_limit_back(host) -> None:
    service = host.service()
    host.run(service, 60)
    assert max(host.limits()) < 700
    host.run(service, 3, declared=False)
    assert host.limits() == [700] * 4 and service.view()["gpus"] == []
    assert not host.originals_file().exists()


def test_a_gpu_taken_out_of_service_goes_back_to_its_own_limit(host) -> None:
    service = host.service()
    host.run(service, 60)
    assert max(host.limits()) < 700
    host.run(service, 2, out_of_service=(2,))  # e.g. validating: benchmarks at its own limit
    assert host.limits()[2] == 700
    assert all(g["index"] != 2 for g in service.view()["gpus"])


def test_a_gpu_without_permission_is_left_alone_and_says_why(host) -> None:
    host.fake.set(1, power_settable=0)
    service = host.service()
    host.run(service, 120)
    limits = host.limits()
    assert limits[1] == 700 and max(limits[0:1] + limits[2:]) < 700
    row = service.view()["gpus"][1]
    assert row["state"] == "unmanaged" and "Insufficient Permissions" in row["why"]
    assert service.changes["failed"] == 1


def test_a_gpu_that_ignores_the_call_is_found_out(host) -> None:
    host.fake.set(2, power_ignores=1)
    service = host.service()
    host.run(service, 60)
    row = service.view()["gpus"][2]
    assert row["state"] == "unmanaged" and "ignores power limit changes" in row["why"]
    limits = host.limits()
    assert limits[2] == 700 and max(limits[:2] + limits[3:]) < 700


def test_a_set_call_that_hangs_is_given_up_and_undone_once_the_gpu_answers(host) -> None:
    host.fake.hang(0, "nvmlDeviceSetPowerManagementLimit")
    service = host.service(call_timeout=0.3)
    try:
        host.run(service, 30)
        row = service.view()["gpus"][0]
        assert row["state"] == "unmanaged" and "did not return in 0.3 s" in row["why"]
        assert max(host.limits()[1:]) < 700
    finally:
        host.fake.release(0)
        # The abandoned calls return now (and may land): none may outlive this test.
        wait_until(lambda: not any(t.name == "nvml-bounded" and t.is_alive()
                                   for t in threading.enumerate()), what="the hung calls")
    # Whatever landed late, the GPU is put back at its own limit once it answers.
    host.run(service, 15)
    assert host.limits()[0] == 700 and service.view()["gpus"][0]["set_w"] is None


def test_ranks_waiting_on_a_straggler_are_lowered_below_it(host) -> None:
    host.speeds[3] = 0.85  # rank 3 computes slower; the others wait for it
    host.declaration = JobDeclaration(JOB, energy=EnergyAllowance(0.05))
    service = host.service()
    host.run(service, 400)
    limits = host.limits()
    assert limits[3] > max(limits[:3]), limits
    assert [g["waits_on_others"] for g in service.view()["gpus"]][:3] == [True] * 3
    # The waiting ranks gave up power the job did not need.
    assert 1 - host.pace() / (host.base_rate * 0.85) < 0.05


def test_what_a_killed_run_left_lowered_is_put_back_at_the_next_start(host) -> None:
    service = host.service()
    host.run(service, 40)
    lowered = host.limits()
    assert max(lowered) < 700 and host.originals_file().exists()
    service.control.stop()  # killed: nothing restored, the file stays
    host.services.remove(service)
    assert host.limits() == lowered
    again = host.service()
    assert host.limits() == [700] * 4 and not host.originals_file().exists()
    assert again.view()["left_lowered"] == []


def test_a_restore_that_fails_at_start_stays_on_file_for_the_next(host) -> None:
    service = host.service()
    host.run(service, 40)
    service.control.stop()
    host.services.remove(service)
    host.fake.set(0, power_settable=0)  # e.g. a capability the new agent lacks
    again = host.service()
    left = again.view()["left_lowered"]
    assert [x["index"] for x in left] == [0] and "Insufficient Permissions" in left[0]["error"]
    assert host.limits()[1:] == [700] * 3
    saved = json.loads(host.originals_file().read_text())["gpus"]
    assert list(saved) == [host.uuids[0]]
    # And the loop does not take the GPU's lowered limit for its own: its original is 700.
    host.fake.set(0, power_settable=1)
    host.run(again, 10)
    assert again.view()["gpus"][0]["original_w"] == 700


def test_an_unreadable_originals_file_is_reported_and_left(host) -> None:
    host.originals_file().write_text("{not json")
    service = host.service()
    assert "unreadable" in service.view()["originals_error"]
    assert host.originals_file().read_text() == "{not json"
