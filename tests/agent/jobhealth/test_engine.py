"""Job health's engine on fixtures: the host's view of each communicator, the causes
joined from what the host knows, and when it reports to the controller."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.jobhealth.engine import JobHealthEngine, cause_of
from agent.jobhealth.settings import JobHealthSection
from agent.jobhealth.types import CommReading, HostReading, JobReading, RankReading
from harmonaize.messages import Cause, Finding, JobRankProgress, ProcessState
from harmonaize.messages.codec import decode, encode

pytestmark = pytest.mark.jobhealth

JOB, COMM = "train-7", 0x5EED


def ranks(counts: dict[int, int], state: dict[int, ProcessState] | None = None,
          gpu_fault: set[int] = frozenset()) -> tuple[RankReading, ...]:
    state = state or {}
    return tuple(RankReading((1000 + r, 7), str(r), c, state.get(r, ProcessState.SLEEPING),
                             r in gpu_fault) for r, c in counts.items())


def host(readings: tuple[RankReading, ...], n_ranks: int | None = None, *,
         exited: frozenset[tuple[int, int]] = frozenset(), gpu_fault: bool = False,
         network: bool = False, busy: float | None = None) -> HostReading:
    comm = CommReading(COMM, n_ranks or len(readings), readings)
    return HostReading((JobReading(JOB, (comm,), exited, gpu_fault, busy),), network)


def run(engine: JobHealthEngine, reading: HostReading, start: float, end: float,
        step: float = 0.1) -> list[JobRankProgress]:
    reports = []
    now = start
    while now <= end + 1e-9:
        reports += engine.step(reading, now).reports
        now = round(now + step, 6)
    return reports


def test_item1_a_stopped_rank_behind_the_others_is_a_local_hang_naming_its_rank() -> None:
    engine = JobHealthEngine(JobHealthSection())
    moving = [{r: 100 + t for r in range(4)} for t in range(5)]
    for t, counts in enumerate(moving):
        engine.step(host(ranks(counts)), t * 0.1)
    frozen = host(ranks({0: 110, 1: 110, 2: 109, 3: 110}, {2: ProcessState.STOPPED}))
    reports = run(engine, frozen, 1.0, 4.1)
    verdict = engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.finding is Finding.HANG
    assert [r.rank for r in verdict.ranks] == ["2"]
    assert verdict.cause is Cause.PROCESS_NOT_RUNNING and verdict.at_collective == 109
    # Reported when the still-state crossed hang_after, naming rank 2 first (behind).
    (comm,) = reports[-1].comms
    assert comm.finding is Finding.HANG and comm.still_for >= 3.0
    assert comm.ranks[0].rank == "2" and comm.ranks[0].process is ProcessState.STOPPED
    assert (comm.collectives_min, comm.collectives_max, comm.ranks_here) == (109, 110, 4)
    assert decode(encode(reports[-1], sender="h1")).body == reports[-1]  # valid on the wire


def test_item1_a_killed_rank_stays_known_as_exited_and_is_named_process_exited() -> None:
    engine = JobHealthEngine(JobHealthSection())
    engine.step(host(ranks({0: 50, 1: 50, 2: 50})), 0.0)
    engine.step(host(ranks({0: 52, 1: 52, 2: 51})), 0.1)
    # Rank 2's stats file went (its lock free): the service says its process exited.
    gone = host(ranks({0: 53, 1: 53}), 3, exited=frozenset({(1002, 7)}))
    engine.step(gone, 0.2)
    reports = run(engine, gone, 0.3, 3.5)
    verdict = engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.finding is Finding.HANG
    assert [(r.rank, r.cause) for r in verdict.ranks] == [("2", Cause.PROCESS_EXITED)]
    assert verdict.at_collective == 51
    assert reports[-1].comms[0].ranks[0].process is ProcessState.EXITED
    # Once no live rank is left here, the communicator is forgotten with its verdict.
    changes = engine.step(host((), 3, exited=frozenset({(1000, 7), (1001, 7)})), 4.0).changes
    assert [c.active for c in changes] == [False]
    assert engine.jobs == {}


def test_item2_causes_are_joined_most_specific_first() -> None:
    assert cause_of(ProcessState.EXITED, True, True) is Cause.PROCESS_EXITED
    for state in (ProcessState.STOPPED, ProcessState.ZOMBIE, ProcessState.UNINTERRUPTIBLE):
        assert cause_of(state, True, True) is Cause.PROCESS_NOT_RUNNING
    assert cause_of(ProcessState.SLEEPING, True, True) is Cause.GPU_FAULT
    assert cause_of(ProcessState.RUNNING, False, True) is Cause.NETWORK
    assert cause_of(ProcessState.RUNNING, False, False) is Cause.UNKNOWN


def test_item2_a_rank_behind_on_a_faulty_gpu_hangs_with_cause_gpu_fault() -> None:
    engine = JobHealthEngine(JobHealthSection())
    engine.step(host(ranks({0: 9, 1: 9})), 0.0)
    reading = host(ranks({0: 10, 1: 12}, gpu_fault={0}), gpu_fault=True)
    run(engine, reading, 0.1, 3.5)
    verdict = engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.cause is Cause.GPU_FAULT
    assert [r.rank for r in verdict.ranks] == ["0"]


@pytest.mark.parametrize(("gpu_fault", "network", "cause"), [
    (False, False, Cause.PAUSED), (True, False, Cause.GPU_FAULT), (False, True, Cause.NETWORK)])
def test_item2_every_rank_stopped_together_is_a_stall_whose_cause_is_the_hardwares(
        gpu_fault: bool, network: bool, cause: Cause) -> None:
    cfg = JobHealthSection(stall_after=10.0)
    engine = JobHealthEngine(cfg)
    engine.step(host(ranks({0: 1, 1: 1})), 0.0)
    reading = host(ranks({0: 2, 1: 2}), gpu_fault=gpu_fault, network=network, busy=3.0)
    reports = run(engine, reading, 0.1, 5.0)
    assert engine.judge.verdict(JOB, COMM) is None  # not a hang on counts alone
    reports += run(engine, reading, 5.1, 10.2)
    verdict = engine.judge.verdict(JOB, COMM)
    assert verdict is not None and (verdict.finding, verdict.cause) == (Finding.STALL, cause)
    assert reports[-1].comms[0].gpu_busy == 3.0 and reports[-1].comms[0].finding is Finding.STALL


def test_item3_reports_at_each_crossing_each_change_and_every_report_interval() -> None:
    cfg = JobHealthSection(report_interval=10.0, stall_after=20.0)
    engine = JobHealthEngine(cfg)
    at = []
    counts = {0: 5, 1: 5}
    for t in range(6):  # moving for 3 s: the first report, nothing else
        counts = {r: c + 1 for r, c in counts.items()}
        if engine.step(host(ranks(counts)), t * 0.5).reports:
            at.append(t * 0.5)
    assert at == [0.0]
    still = host(ranks(counts))
    for t in range(6, 80):
        if engine.step(still, t * 0.5).reports:
            at.append(t * 0.5)
    # hang_after crossed at 2.5 + 3 s, then every 10 s, stall_after at 2.5 + 20 s.
    assert at == [0.0, 5.5, 15.5, 22.5, 32.5]
    # Moving again is reported at once (the controller withdraws what it told).
    moved = host(ranks({r: c + 1 for r, c in counts.items()}))
    assert engine.step(moved, 40.0).reports[0].comms[0].still_for == 0.0


def test_item3_caps_a_thousands_of_ranks_job_to_the_message_limits() -> None:
    engine = JobHealthEngine(JobHealthSection())
    comms = tuple(CommReading(c, 4096, tuple(
        RankReading((c * 10_000 + r, 1), str(r), 1000 + (r % 7), ProcessState.SLEEPING)
        for r in range(300 if c == 0 else 2))) for c in range(80))
    report = engine.step(HostReading((JobReading(JOB, comms),)), 0.0).reports[0]
    assert len(report.comms) == 64
    big = next(c for c in report.comms if c.comm == 0)
    assert len(big.ranks) == 256 and big.ranks_here == 300
    assert [r.collectives for r in big.ranks] == sorted(r.collectives for r in big.ranks)
    assert decode(encode(report, sender="h1")).body == report


def test_item3_the_next_deadline_is_the_next_threshold_or_report() -> None:
    engine = JobHealthEngine(JobHealthSection(report_interval=10.0))
    engine.step(host(ranks({0: 1, 1: 1})), 0.0)
    engine.step(host(ranks({0: 2, 1: 3})), 1.0)
    engine.step(host(ranks({0: 2, 1: 3})), 1.5)
    assert engine.next_deadline() == pytest.approx(4.0)  # 1.0 + hang_after
    engine.step(host(ranks({0: 2, 1: 3})), 4.0)
    assert engine.next_deadline() == pytest.approx(14.0)  # the next report


def test_item1_a_job_that_ended_is_forgotten_and_its_verdicts_end() -> None:
    engine = JobHealthEngine(JobHealthSection())
    engine.step(host(ranks({0: 1, 1: 1})), 0.0)
    run(engine, host(ranks({0: 1, 1: 2})), 0.1, 4.0)
    assert engine.judge.verdicts()
    changes = engine.step(HostReading(()), 4.1).changes
    assert [c.active for c in changes] == [False] and engine.jobs == {}
    assert engine.found[("hang", "unknown")] == 1


@given(st.lists(st.tuples(st.floats(0.01, 8.0), st.lists(st.integers(0, 2), max_size=3),
                          st.booleans()), min_size=1, max_size=40))
@settings(max_examples=200, deadline=None)
def test_item3_the_next_deadline_is_never_already_past(
        moves: list[tuple[float, list[int], bool]]) -> None:
    """The daemon wakes at it: one already past would step it again and again."""
    engine = JobHealthEngine(JobHealthSection(stall_after=10.0, judge_interval=0.5))
    counts = {0: 0, 1: 0, 2: 0}
    now = 0.0
    for dt, moved, stopped in moves:
        now += dt
        for rank in moved:
            counts[rank] += 1
        states = {2: ProcessState.STOPPED} if stopped else None
        engine.step(host(ranks(counts, states)), now)
        deadline = engine.next_deadline()
        assert deadline is None or deadline > now


def test_item3_a_reload_gives_the_running_judge_its_new_thresholds() -> None:
    engine = JobHealthEngine(JobHealthSection())
    engine.step(host(ranks({0: 1, 1: 1})), 0.0)
    engine.step(host(ranks({0: 1, 1: 2})), 0.1)
    engine.step(host(ranks({0: 1, 1: 2})), 1.7)
    assert engine.judge.verdict(JOB, COMM) is None  # 1.6 s still: under 3 s
    engine.configure(JobHealthSection(hang_after=1.5, stall_after=30.0))
    engine.step(host(ranks({0: 1, 1: 2})), 1.8)
    verdict = engine.judge.verdict(JOB, COMM)
    assert verdict is not None and verdict.finding is Finding.HANG
