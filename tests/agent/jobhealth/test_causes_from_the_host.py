"""Each rank's cause joined from what the host knows: its GPU (the GPU sample's
processes and the GPU domain's states and conditions), the host's data links (the links
domain's held levels); for a stall, the job's GPUs' faults and utilisation. The GPU and
link samples are fixtures (the hardware's edge); /proc is a real tree of files."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from agent.conditions import Action
from agent.gpu.interface import GpuSample, GpuSnapshot, GpuState, GpuView, JobRef, JobResolver
from agent.gpu.types import GpuIdentity, GpuProcess, GpuTelemetry
from agent.jobhealth.service import JobHealthService
from agent.jobhealth.settings import JobHealthSection
from agent.links.interface import LinkLevels
from agent.plugin.layout import StatsSlot, StatsSlots
from harmonaize.messages import Cause, Condition, Finding, Level, Severity, Status

pytestmark = pytest.mark.jobhealth

JOB, COMM = "train-hw", 0x7700000000000001
PIDS = (31_001, 31_002)


class Stats:
    def __init__(self, stats: Mapping[str, StatsSlots]) -> None:
        self.stats = stats


def proc_tree(root: Path) -> None:
    for rank, pid in enumerate(PIDS):
        (root / str(pid)).mkdir()
        (root / str(pid) / "stat").write_bytes(
            f"{pid} (rank) S 1 ".encode() + b"0 " * 17 + b"777\n")
        (root / str(pid) / "environ").write_bytes(f"HARMONAIZE_JOB={JOB}\0RANK={rank}\0".encode())
        (root / str(pid) / "status").write_text("Uid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n")


def gpu_sample() -> GpuSample:
    snaps = tuple(GpuSnapshot(
        GpuIdentity(i, f"GPU-{i}", "NVIDIA H200", f"0000:0{i}:00.0", 5, 16, 18),
        telemetry=GpuTelemetry(50, 300.0, 700.0, 1980, 1980, 2619, 10 * (i + 1), 5, 1 << 37,
                               1 << 30, 5, 16, 18, processes=(GpuProcess(pid, 1 << 30),)))
        for i, pid in enumerate(PIDS))
    return GpuSample(snaps, (), {0: (JobRef(JOB, "0"),), 1: (JobRef(JOB, "1"),)})


def view(index: int, state: GpuState = GpuState.HEALTHY, xid: bool = False) -> GpuView:
    conditions = (Condition("Xid", Status.TRUE, "Xid79", "", Severity.CRITICAL),) if xid else ()
    return GpuView(index, f"GPU-{index}", "NVIDIA H200", state, "", 0.0, Action.NONE,
                   conditions, {}, (), 0, None)


def judged(tmp_path: Path, counts: tuple[int, int], gpus: tuple[GpuView, ...],
           links: tuple[LinkLevels, ...] = (), seconds: float = 4.0,
           cfg: JobHealthSection | None = None) -> JobHealthService:
    cfg = cfg or JobHealthSection()
    proc_tree(tmp_path)
    sent: list[object] = []
    service = JobHealthService(cfg, publish=sent.append,
                               resolver=JobResolver(tmp_path, "HARMONAIZE_JOB", "", ("RANK",)),
                               proc_root=str(tmp_path))
    start = StatsSlots(StatsSlot(pid, COMM, 2, 1, 0, tag=1) for pid in PIDS)
    service.step(Stats({JOB: start}), gpu_sample(), gpus, links, 0.0)
    frozen = StatsSlots(StatsSlot(pid, COMM, 2, 1, c, tag=1) for pid, c in zip(PIDS, counts,
                                                                               strict=True))
    now = 0.0
    while now < seconds:
        now = round(now + 0.1, 3)
        service.step(Stats({JOB: frozen}), gpu_sample(), gpus, links, now)
    return service


def test_item2_a_rank_behind_on_an_out_of_service_gpu_hangs_with_cause_gpu_fault(
        tmp_path: Path) -> None:
    service = judged(tmp_path, (12, 11), (view(0), view(1, GpuState.QUARANTINED)))
    verdict = service.engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.finding is Finding.HANG
    assert [(r.rank, r.cause) for r in verdict.ranks] == [("1", Cause.GPU_FAULT)]


def test_item2_a_rank_behind_on_a_host_whose_data_link_is_down_hangs_with_cause_network(
        tmp_path: Path) -> None:
    links = (LinkLevels("eth1", "data", False, Level.NONE, Level.NONE),
             LinkLevels("eth9", "storage", True, Level.NONE, Level.NONE))
    service = judged(tmp_path, (12, 11), (view(0), view(1)), links)
    verdict = service.engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.cause is Cause.NETWORK


def test_item2_a_rank_behind_with_nothing_found_at_fault_is_unknown(tmp_path: Path) -> None:
    links = (LinkLevels("eth9", "storage", False, Level.NONE, Level.HIGH),)
    service = judged(tmp_path, (11, 12), (view(0), view(1)), links)
    verdict = service.engine.judge.verdict(JOB, COMM)
    assert verdict is not None and [(r.rank, r.cause) for r in verdict.ranks] == [
        ("0", Cause.UNKNOWN)]


def test_item2_a_stall_takes_its_cause_from_an_xid_on_the_jobs_gpu_and_reports_busy(
        tmp_path: Path) -> None:
    cfg = JobHealthSection(stall_after=5.0)
    service = judged(tmp_path, (12, 12), (view(0), view(1, xid=True)), seconds=5.5, cfg=cfg)
    verdict = service.engine.judge.verdict(JOB, COMM)
    assert verdict is not None and (verdict.finding, verdict.cause) == (
        Finding.STALL, Cause.GPU_FAULT)
    assert [r.rank for r in verdict.ranks] == ["1"]
    report = service.engine.report(JOB, 5.5)
    assert report.comms[0].gpu_busy == pytest.approx(15.0)  # GPUs 0 and 1: 10 % and 20 %


def test_item1_a_pid_reused_by_another_process_is_the_rank_exited_not_the_newcomer(
        tmp_path: Path) -> None:
    """The stats file outlives its process (a fork kept its lock); the pid now belongs
    to another process, started later: the rank is gone, named process-exited."""
    proc_tree(tmp_path)
    service = JobHealthService(JobHealthSection(), publish=lambda message: None,
                               resolver=JobResolver(tmp_path, "HARMONAIZE_JOB", "", ("RANK",)),
                               proc_root=str(tmp_path))
    stats = Stats({JOB: StatsSlots(StatsSlot(pid, COMM, 2, 1, 5 + i, tag=1)
                                   for i, pid in enumerate(PIDS))})
    service.step(stats, None, (), (), 0.0)
    reused = tmp_path / str(PIDS[0]) / "stat"
    reused.write_bytes(f"{PIDS[0]} (other) R 1 ".encode() + b"0 " * 17 + b"999999\n")
    now = 0.0
    while now < 4.0:
        now = round(now + 0.1, 3)
        service.step(stats, None, (), (), now)
    verdict = service.engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.finding is Finding.HANG
    assert [(r.rank, r.cause) for r in verdict.ranks] == [("0", Cause.PROCESS_EXITED)]
