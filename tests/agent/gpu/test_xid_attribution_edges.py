"""XID attribution at its edges: windows to the second, what each verdict says and
carries, what the attribution keeps and forgets, its defaults and bounds."""

from __future__ import annotations

import pytest

from agent.gpu.attribution import (
    MAX_GONE,
    MAX_LINES,
    AttributionSettings,
    Verdict,
    XidAttributor,
)
from agent.gpu.types import JobRef
from agent.gpu.xid import Effect
from agent.kernel.kmsgformat import KernelXid, pci_key

pytestmark = pytest.mark.jobhealth

PCI = pci_key("0000:3b:00")
A0, A1, B0 = JobRef("job-a", "0"), JobRef("job-a", "1"), JobRef("job-b", "0")
SETTINGS = AttributionSettings(kmsg_wait=2.0, match_window=10.0, teardown_window=5.0,
                               recur_window=100.0)


def line(xid: int, pid: int | None, name: str | None = "python") -> KernelXid:
    return KernelXid(PCI, xid, pid, name, 1)  # type: ignore[arg-type]


def engine(pids: dict, exiting: tuple[int, ...] = (), at: float = 0.0) -> XidAttributor:
    attributor = XidAttributor(SETTINGS)
    attributor.observe(0, PCI, pids, exiting, at)
    return attributor


def test_the_defaults_wait_two_seconds_for_the_kernels_line() -> None:
    attributor = XidAttributor()
    assert attributor.settings == AttributionSettings()
    assert attributor.next_deadline() == float("inf")
    attributor.report(0, 31, 10.0)
    attributor.report(0, 13, 11.0)
    assert attributor.next_deadline() == 12.0
    assert attributor.decide(11.9) == [] and len(attributor.decide(12.0)) == 1
    assert attributor.next_deadline() == 13.0


def test_what_an_application_verdict_says_and_carries() -> None:
    attributor = engine({100: A0, 101: A1, 200: B0})
    attributor.kernel([line(31, 101)], 10.0)
    attributor.report(0, 31, 10.0)
    (result,) = attributor.decide(10.0)
    assert result == type(result)(0, 31, 10.0, Verdict.APPLICATION,
                                  "the kernel names pid 101 (python) of job job-a",
                                  Effect.NONE, "job-a", ("1",), False, 101)


def test_what_the_other_ties_say() -> None:
    attributor = engine({100: A0, 101: A1}, exiting=(100,))
    attributor.kernel([line(13, 100, None)], 10.0)
    attributor.report(0, 13, 10.0)
    (by_pid,) = attributor.decide(10.0)
    assert by_pid.why == "the kernel names pid 100 (?) of job job-a, exiting"
    assert by_pid.teardown
    attributor.report(0, 43, 20.0)
    (ending,) = attributor.decide(22.0)
    assert ending.why == "job job-a's process on this GPU was ending (teardown)"
    assert (ending.ranks, ending.pid) == (("0",), None)
    attributor.observe(0, PCI, {100: A0, 101: A1}, (), 30.0)
    attributor.report(0, 13, 30.0)
    (only,) = attributor.decide(32.0)
    assert only.why == "job job-a is the GPU's only user" and not only.teardown
    assert only.ranks == ("0", "1")


def test_what_doubt_says() -> None:
    attributor = engine({100: A0, 200: B0}, exiting=(100, 200))
    attributor.report(0, 45, 1.0)
    (two,) = attributor.decide(3.0)
    assert (two.verdict, two.why) == (Verdict.HARDWARE,
                                      "processes of 2 jobs were ending on this GPU")
    attributor.kernel([line(31, 999)], 5.0)
    attributor.report(0, 31, 5.0)
    (stranger,) = attributor.decide(5.0)
    assert stranger.why == "the kernel names pid 999, no job's process on this GPU"
    assert (stranger.pid, stranger.job, stranger.effect) == (999, None, Effect.SUSPECT)
    attributor.report(0, 48, 6.0)
    (hardware,) = attributor.decide(6.0)
    assert hardware.why == "the catalog lists only hardware causes"
    assert hardware.effect is Effect.QUARANTINE


def test_a_kernel_line_ties_one_xid_only() -> None:
    attributor = engine({100: A0, 200: B0})
    attributor.kernel([line(31, 200)], 10.0)
    attributor.report(0, 31, 10.0)
    attributor.report(0, 31, 10.0)
    first, second = attributor.decide(12.0)
    assert (first.job, first.verdict) == ("job-b", Verdict.APPLICATION)
    assert second.verdict is Verdict.HARDWARE  # its own line never came


def test_the_match_window_holds_to_the_second_either_way() -> None:
    for seen, matches in ((0.0, True), (-0.01, False), (20.0, True), (20.01, False)):
        attributor = engine({100: A0, 200: B0})
        attributor.kernel([line(31, 200)], seen)
        attributor.report(0, 31, 10.0)
        (result,) = attributor.decide(12.0)
        assert (result.job == "job-b") is matches, seen


def test_the_teardown_window_holds_to_the_second() -> None:
    for left, teardown in ((5.0, True), (4.99, False)):
        attributor = engine({100: A0, 200: B0})
        attributor.observe(0, PCI, {200: B0}, (), left)
        attributor.report(0, 45, 10.0)
        (result,) = attributor.decide(12.0)
        assert (result.teardown, result.job) == ((True, "job-a") if teardown
                                                 else (False, "job-b")), left


def test_the_recur_window_holds_to_the_second() -> None:
    for later, hardware in ((110.0, True), (110.01, False)):
        attributor = engine({100: A0})
        attributor.report(0, 31, 10.0)
        attributor.decide(12.0)
        attributor.observe(0, PCI, {}, (), 50.0)  # job-a ended long before
        attributor.observe(0, PCI, {200: B0}, (), later - 1)
        attributor.report(0, 31, later)
        (result,) = attributor.decide(later + 2)
        assert (result.verdict is Verdict.HARDWARE) is hardware, later
        assert (result.why == "recurs on this GPU across jobs (job-a, then job-b)") is hardware


def test_a_different_xid_under_another_job_is_no_recurrence() -> None:
    attributor = engine({100: A0})
    attributor.report(0, 31, 10.0)
    attributor.decide(12.0)
    attributor.observe(0, PCI, {200: B0}, (), 20.0)
    attributor.report(0, 13, 21.0)
    (result,) = attributor.decide(23.0)
    assert result.verdict is Verdict.APPLICATION


def test_a_recurrence_is_remembered_for_the_next() -> None:
    attributor = engine({100: A0})
    for at, ref in ((10.0, A0), (20.0, B0), (30.0, JobRef("job-c", "0"))):
        attributor.observe(0, PCI, {}, (), at - 9)  # the job before ended long before
        attributor.observe(0, PCI, {100 + int(at): ref}, (), at - 1)
        attributor.report(0, 31, at)
        attributor.decide(at + 2)
    assert [x[1] for x in attributor.gpus[0].tied] == ["job-a", "job-b", "job-c"]


def test_processes_that_could_not_be_listed_are_not_taken_for_gone() -> None:
    attributor = engine({100: A0, 200: B0})
    attributor.observe(0, PCI, {}, (), 9.0, listed=False)
    assert attributor.gpus[0].gone == {} and attributor.gpus[0].pids == {100: A0, 200: B0}
    attributor.report(0, 45, 10.0)
    (result,) = attributor.decide(12.0)
    assert result.verdict is Verdict.HARDWARE


def test_what_left_is_forgotten_when_it_returns_or_grows_old() -> None:
    attributor = engine({100: A0, 200: B0})
    attributor.observe(0, PCI, {200: B0}, (), 1.0)
    assert attributor.gpus[0].gone == {100: (A0, 1.0)}
    attributor.observe(0, PCI, {100: A0, 200: B0}, (), 2.0)  # the pid is back
    assert attributor.gpus[0].gone == {}
    attributor.observe(0, PCI, {200: B0}, (), 3.0)
    attributor.observe(0, PCI, {200: B0}, (), 18.0)  # 15 s: the windows' sum
    assert attributor.gpus[0].gone == {100: (A0, 3.0)}
    attributor.observe(0, PCI, {200: B0}, (), 18.01)
    assert attributor.gpus[0].gone == {}


def test_what_left_is_bounded() -> None:
    attributor = engine({pid: A0 for pid in range(MAX_GONE + 10)})
    attributor.observe(0, PCI, {}, (), 1.0)
    gone = attributor.gpus[0].gone
    assert len(gone) == MAX_GONE and min(gone) == 10  # the oldest go first


def test_kernel_lines_are_bounded() -> None:
    attributor = XidAttributor(SETTINGS)
    attributor.kernel([line(31, n) for n in range(MAX_LINES + 5)], 1.0)
    assert len(attributor.lines) == MAX_LINES and attributor.lines[0][0].pid == 5


def test_an_xid_on_a_gpu_never_observed_is_doubt() -> None:
    attributor = XidAttributor(SETTINGS)
    attributor.report(7, 31, 1.0)
    (result,) = attributor.decide(3.0)
    assert (result.gpu, result.verdict, result.effect) == (7, Verdict.HARDWARE, Effect.SUSPECT)


def test_a_process_that_ended_while_still_listed_keeps_its_job_for_its_teardown() -> None:
    """Killed and reaped before NVML dropped it: /proc can no longer resolve the pid
    (its job reads None) while it is listed; its teardown's XID is still its job's."""
    attributor = engine({100: A0, 200: B0})
    attributor.observe(0, PCI, {100: None, 200: B0}, (100,), 1.0)  # ended, still listed
    attributor.observe(0, PCI, {200: B0}, (), 2.0)  # then gone from the GPU
    attributor.report(0, 45, 3.0)
    (result,) = attributor.decide(5.0)
    assert (result.verdict, result.job, result.teardown) == (Verdict.APPLICATION, "job-a",
                                                             True)


def test_a_live_pid_that_cannot_be_resolved_inherits_no_job() -> None:
    """Only a pid /proc shows ending keeps the job it had: one that lives on unresolved
    (its job's facts unreadable now) is no one's, so its XID stays in doubt."""
    attributor = engine({100: A0})
    attributor.observe(0, PCI, {100: None}, (), 1.0)
    attributor.kernel([line(31, 100)], 2.0)
    attributor.report(0, 31, 2.0)
    (result,) = attributor.decide(4.0)
    assert (result.verdict, result.job) == (Verdict.HARDWARE, None)
