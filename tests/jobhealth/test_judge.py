"""The progress judge: which ranks hold a communicator up, from counts and processes."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from harmonaize.messages import Cause, Finding, ProcessState
from harmonaize.progress import CommSample, ProgressJudge, ProgressSettings, RankSample

pytestmark = pytest.mark.jobhealth


def sample(counts: dict[str, int], still: float, *, n_ranks: int | None = None,
           process: dict[str, ProcessState] | None = None,
           cause: dict[str, Cause] | None = None, fault: Cause | None = None,
           simultaneous: bool = True) -> CommSample:
    process, cause = process or {}, cause or {}
    ranks = tuple(RankSample(r, c, process.get(r, ProcessState.SLEEPING),
                             cause.get(r, Cause.UNKNOWN)) for r, c in counts.items())
    return CommSample("job-7", 17, n_ranks or len(counts), ranks, still, fault, simultaneous)


def test_item1_hang_names_the_ranks_that_never_issued_the_collective_the_others_wait_in():
    judge = ProgressJudge()
    counts = {str(r): 1202 for r in range(8)} | {"3": 1200}
    assert judge.step([sample(counts, 1.0)], 100.0) == []
    assert judge.next_deadline() == pytest.approx(102.0)
    changes = judge.step([sample(counts, 3.0, process={"3": ProcessState.STOPPED},
                                 cause={"3": Cause.PROCESS_NOT_RUNNING})], 102.0)
    assert [c.active for c in changes] == [True]
    verdict = changes[0].verdict
    assert (verdict.finding, verdict.cause, [r.rank for r in verdict.ranks],
            verdict.at_collective) == (Finding.HANG, Cause.PROCESS_NOT_RUNNING, ["3"], 1200)
    # the same finding again is no news; the ranks moving again withdraws it
    assert judge.step([sample(counts, 9.0, process={"3": ProcessState.STOPPED},
                              cause={"3": Cause.PROCESS_NOT_RUNNING})], 108.0) == []
    moved = judge.step([sample(counts | {"3": 1203}, 0.0)], 109.0)
    assert [(c.active, c.verdict.finding) for c in moved] == [(False, Finding.HANG)]
    assert judge.verdicts() == {}


def test_item1_every_rank_stopped_at_one_index_is_a_stall_never_a_hang_on_counts_alone():
    judge = ProgressJudge(ProgressSettings(hang_after=3.0, stall_after=60.0))
    counts = {str(r): 500 for r in range(8)}
    assert judge.step([sample(counts, 30.0)], 10.0) == []
    assert judge.next_deadline() == pytest.approx(40.0)
    paused = judge.step([sample(counts, 61.0)], 41.0)
    assert [(c.verdict.finding, c.verdict.cause) for c in paused] == [
        (Finding.STALL, Cause.PAUSED)]
    faulty = judge.step([sample(counts, 62.0, fault=Cause.GPU_FAULT,
                                cause={"5": Cause.GPU_FAULT})], 42.0)
    assert [(c.active, c.verdict.cause, [r.rank for r in c.verdict.ranks])
            for c in faulty] == [(False, Cause.PAUSED, [str(r) for r in range(8)]),
                                 (True, Cause.GPU_FAULT, ["5"])]


def test_item1_a_partial_view_concludes_no_stall_but_a_stopped_process_is_a_hang():
    judge = ProgressJudge()
    counts = {"4": 90, "5": 90}
    assert judge.step([sample(counts, 100.0, n_ranks=8)], 1.0) == []
    changes = judge.step([sample(counts, 100.0, n_ranks=8,
                                 process={"5": ProcessState.UNINTERRUPTIBLE},
                                 cause={"5": Cause.PROCESS_NOT_RUNNING})], 2.0)
    assert [r.rank for r in changes[0].verdict.ranks] == ["5"]


def test_item1_an_exited_rank_at_an_equal_count_is_a_job_ending_not_a_hang():
    judge = ProgressJudge()
    counts = {"0": 77, "1": 77}
    changes = judge.step([sample(counts, 10.0, process={"1": ProcessState.EXITED},
                                 cause={"1": Cause.PROCESS_EXITED})], 5.0)
    assert changes == []


def test_item1_straggler_is_named_after_staying_behind_by_the_margin_for_the_window():
    judge = ProgressJudge(ProgressSettings(straggler_margin=1.0, straggler_window=10.0))
    found = []
    for second in range(40):
        high = 10 * second
        counts = {"0": high, "1": high, "2": high - 15}  # 1.5 s behind at 10 a second
        found += judge.step([sample(counts, 0.0)], float(second))
    assert [(c.verdict.finding, [r.rank for r in c.verdict.ranks]) for c in found] == [
        (Finding.STRAGGLER, ["2"])]
    assert found[0].verdict.since >= 10.0


def test_item1_a_rank_merely_slow_within_the_margin_is_no_straggler():
    judge = ProgressJudge(ProgressSettings(straggler_margin=2.0, straggler_window=10.0))
    for second in range(60):
        high = 10 * second
        counts = {"0": high, "1": high - (second % 3) * 5}  # at most 1 s behind
        assert judge.step([sample(counts, 0.0)], float(second)) == []


def test_item1_counts_from_several_hosts_at_several_instants_name_no_straggler():
    judge = ProgressJudge(ProgressSettings(straggler_margin=1.0, straggler_window=5.0))
    for second in range(30):
        counts = {"0": 10 * second, "1": 10 * second - 20}
        assert judge.step([sample(counts, 0.0, simultaneous=False)], float(second)) == []


def test_item1_dropping_a_communicator_withdraws_its_verdict():
    judge = ProgressJudge()
    judge.step([sample({"0": 3, "1": 4}, 5.0)], 1.0)
    assert [c.active for c in judge.drop([("job-7", 17)])] == [False]
    assert judge.drop([("job-7", 17)]) == []


@pytest.mark.parametrize("bad", [
    dict(hang_after=0.0), dict(stall_after=1.0, hang_after=3.0), dict(straggler_window=-1.0)])
def test_settings_out_of_range_are_refused_with_one_line(bad: dict[str, float]):
    with pytest.raises(ValueError, match="must"):
        ProgressSettings(**bad)


@settings(max_examples=200, derandomize=True)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=12), st.floats(0.0, 200.0),
       st.integers(0, 11))
@example([3, 3, 3], 70.0, 0)
def test_a_hang_or_stall_needs_stillness_and_names_only_ranks_at_the_minimum(
        counts: list[int], still: float, stopped: int):
    judge = ProgressJudge()
    names = {str(i): c for i, c in enumerate(counts)}
    changes = judge.step([sample(names, still)], 1000.0)
    for change in changes:
        verdict = change.verdict
        assert still >= judge.settings.hang_after
        if verdict.finding is Finding.HANG:
            assert {r.collectives for r in verdict.ranks} == {min(counts)}
        else:
            assert verdict.finding is Finding.STALL and len(set(counts)) == 1
