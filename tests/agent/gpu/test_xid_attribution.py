"""XID attribution, rule by rule: the catalog's class, the kernel's line naming a job's
process, a teardown, the GPU's only job, recurrence across jobs, and doubt."""

from __future__ import annotations

import dataclasses

import pytest

from agent.gpu.attribution import (
    MAX_PENDING,
    Attributed,
    AttributionSettings,
    Verdict,
    XidAttributor,
)
from agent.gpu.types import JobRef
from agent.gpu.xid import CATALOG, Attribution, Effect
from agent.kernel.kmsgformat import KernelXid, pci_key

pytestmark = pytest.mark.jobhealth

PCI = pci_key("00000000:3B:00.0")
A0, A1, B0 = JobRef("job-a", "0"), JobRef("job-a", "1"), JobRef("job-b", "0")


def line(xid: int, pid: int | None, seq: int = 1) -> KernelXid:
    return KernelXid(PCI, xid, pid, "python" if pid else None, seq)  # type: ignore[arg-type]


def attributor(pids: dict[int, JobRef | None] | None = None, exiting: tuple[int, ...] = (),
               ) -> XidAttributor:
    engine = XidAttributor(AttributionSettings(kmsg_wait=2.0, teardown_window=5.0))
    engine.observe(0, PCI, pids or {}, exiting, 0.0)
    return engine


def decide(engine: XidAttributor, xid: int, at: float = 10.0,
           kernel: tuple[KernelXid, ...] = ()) -> Attributed:
    engine.kernel(kernel, at)
    engine.report(0, xid, at)
    decided = engine.decide(at)
    if not decided:
        assert engine.next_deadline() == at + 2.0  # waits for the kernel's line
        decided = engine.decide(at + 2.0)
    (result,) = decided
    return result


def test_every_catalog_entry_has_a_class_and_cites_nvidias_catalog() -> None:
    for info in CATALOG.values():
        assert info.attribution in Attribution and info.cites, info.xid
    assert {x for x, i in CATALOG.items() if i.attribution is not Attribution.HARDWARE} == {
        13, 31, 43, 45}


@pytest.mark.parametrize("xid", [48, 63, 74, 79, 94, 95, 109, 119])
def test_hardware_xids_are_the_hardwares_even_with_a_jobs_pid_and_teardown(xid: int) -> None:
    engine = attributor({100: A0}, exiting=(100,))
    result = decide(engine, xid, kernel=(line(xid, 100),))
    assert result.verdict is Verdict.HARDWARE
    assert result.effect is CATALOG[xid].effect


def test_hardware_xids_are_decided_at_once_without_waiting() -> None:
    engine = attributor({100: A0})
    engine.report(0, 79, 10.0)
    (result,) = engine.decide(10.0)
    assert result.verdict is Verdict.HARDWARE and result.effect is Effect.LOST


def test_the_kernel_naming_a_jobs_process_makes_it_the_applications() -> None:
    engine = attributor({100: A0, 200: B0})  # two jobs share the GPU: only the pid tells
    result = decide(engine, 31, kernel=(line(31, 200),))
    assert (result.verdict, result.job, result.ranks) == (Verdict.APPLICATION, "job-b", ("0",))
    assert result.effect is Effect.NONE and not result.teardown


def test_the_kernel_naming_no_jobs_process_is_doubt() -> None:
    engine = attributor({100: A0})
    result = decide(engine, 31, kernel=(line(31, 4242),))
    assert result.verdict is Verdict.HARDWARE and result.effect is Effect.SUSPECT


def test_a_kernel_line_of_another_gpu_or_xid_does_not_tie() -> None:
    engine = attributor({100: A0, 200: B0})
    other_gpu = KernelXid(pci_key("0000:3c:00"), 31, 100, "python", 1)  # type: ignore[arg-type]
    result = decide(engine, 31, kernel=(other_gpu, line(13, 100, seq=2)))
    assert result.verdict is Verdict.HARDWARE  # two jobs, no line of its own: doubt


def test_xid_45_at_a_teardown_is_the_applications() -> None:
    engine = attributor({100: A0, 200: B0})
    engine.observe(0, PCI, {200: B0}, (), 9.0)  # job-a's process left the GPU
    result = decide(engine, 45)
    assert (result.verdict, result.job, result.teardown) == (Verdict.APPLICATION, "job-a",
                                                             True)


def test_a_process_proc_shows_exiting_makes_a_teardown() -> None:
    engine = attributor({100: A0, 101: A1, 200: B0}, exiting=(100, 101))
    result = decide(engine, 43)
    assert (result.verdict, result.job, result.ranks, result.teardown) == (
        Verdict.APPLICATION, "job-a", ("0", "1"), True)


def test_a_process_that_left_long_before_is_no_teardown() -> None:
    engine = attributor({100: A0})
    engine.observe(0, PCI, {}, (), 1.0)
    result = decide(engine, 45, at=20.0)  # 19 s after: past the teardown window
    assert result.verdict is Verdict.HARDWARE


def test_the_gpus_only_job_is_tied_to_an_application_likely_xid() -> None:
    result = decide(attributor({100: A0, 101: A1}), 13)
    assert (result.verdict, result.job, result.ranks) == (Verdict.APPLICATION, "job-a",
                                                          ("0", "1"))


@pytest.fixture
def either_94(monkeypatch: pytest.MonkeyPatch) -> None:
    """No catalog entry is "either" today (109 is kept as the hardware's): 94 made one,
    as it could be (its owner can be told of it)."""
    monkeypatch.setitem(CATALOG, 94, dataclasses.replace(CATALOG[94],
                                                         attribution=Attribution.EITHER))


@pytest.mark.usefixtures("either_94")
def test_the_only_job_rule_does_not_hold_for_an_either_xid() -> None:
    result = decide(attributor({100: A0}), 94)
    assert result.verdict is Verdict.HARDWARE
    assert result.effect is Effect.SUSPECT  # at least suspect, above its catalog's none


def test_an_xid_no_fault_class_tells_of_is_the_hardwares(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(CATALOG, 109, dataclasses.replace(
        CATALOG[109], attribution=Attribution.APPLICATION))
    result = decide(attributor({100: A0}), 109, kernel=(line(109, 100),))
    assert (result.verdict, result.effect) == (Verdict.HARDWARE, Effect.QUARANTINE)
    assert result.why == "no fault class tells a job's owner of it"


def test_the_only_job_rule_needs_every_process_to_be_the_jobs() -> None:
    result = decide(attributor({100: A0, 300: None}), 13)
    assert result.verdict is Verdict.HARDWARE


@pytest.mark.usefixtures("either_94")
def test_an_either_xid_with_the_kernels_pid_of_a_job_is_the_applications() -> None:
    result = decide(attributor({100: A0}), 94, kernel=(line(94, 100),))
    assert result.verdict is Verdict.APPLICATION and result.effect is Effect.NONE


def test_the_same_xid_recurring_across_different_jobs_is_the_hardwares() -> None:
    engine = attributor({100: A0})
    assert decide(engine, 31, at=10.0).verdict is Verdict.APPLICATION
    engine.observe(0, PCI, {200: B0}, (), 100.0)
    again = decide(engine, 31, at=200.0)
    assert again.verdict is Verdict.HARDWARE and "across jobs" in again.why
    assert again.effect is Effect.SUSPECT


def test_the_same_xid_recurring_in_one_job_stays_the_applications() -> None:
    engine = attributor({100: A0})
    decide(engine, 31, at=10.0)
    assert decide(engine, 31, at=20.0).verdict is Verdict.APPLICATION


def test_no_process_at_all_is_doubt_and_the_gpu_at_least_suspect() -> None:
    result = decide(attributor(), 31)
    assert result.verdict is Verdict.HARDWARE and result.effect is Effect.SUSPECT


def test_the_kernel_line_arriving_after_the_event_is_waited_for() -> None:
    engine = attributor({100: A0, 200: B0})
    engine.report(0, 31, 10.0)
    assert engine.decide(10.0) == []
    engine.kernel((line(31, 200),), 10.5)
    (result,) = engine.decide(10.5)  # decided as soon as the line is there
    assert result.job == "job-b"


def test_a_process_exiting_at_the_xid_is_a_teardown_though_later_looks_see_none() -> None:
    """The observer reads /proc only with an XID to judge: what it saw then counts when
    the XID is decided after its wait (a case the benchmark found)."""
    engine = attributor({100: A0, 200: B0}, exiting=(100,))
    engine.report(0, 45, 10.0)
    engine.observe(0, PCI, {100: A0, 200: B0}, (), 11.0)  # no XID here: not read
    (result,) = engine.decide(12.0)
    assert (result.verdict, result.job, result.teardown) == (Verdict.APPLICATION, "job-a",
                                                             True)


def test_a_flood_of_xids_waits_bounded() -> None:
    engine = attributor({100: A0, 200: B0})
    for n in range(MAX_PENDING + 50):
        engine.report(0, 31, 10.0 + n * 1e-4)
    decided = engine.decide(10.2)
    assert len(decided) == 50 and len(engine.pending) == MAX_PENDING
    assert all(d.verdict is Verdict.HARDWARE for d in decided)  # two jobs, no line
