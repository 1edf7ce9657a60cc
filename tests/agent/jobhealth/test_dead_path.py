"""The network named from retransmissions: a still job whose data link is up and clean
but keeps retransmitting (a path that black-holes its packets) gets cause ``network``;
a burst, retransmissions that stopped, a busy link's losses while the job moves, or a
storage link's, do not. The engine on a test clock, the links observer's readings as
fixtures: each rate stands for a second, as the observer reads retransmissions once a
second with eBPF."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config import load
from agent.jobhealth.engine import JobHealthEngine
from agent.jobhealth.retransmits import RetransmitWatch
from agent.jobhealth.service import data_retransmits
from agent.jobhealth.settings import JobHealthSection
from agent.jobhealth.types import CommReading, HostReading, JobReading, RankReading
from agent.links.health import LinkHealthEngine, LinkView
from agent.links.settings import LinksSection
from harmonaize.config import ConfigError
from harmonaize.messages import Cause, Finding, Level, ProcessState
from harmonaize.progress import Change

pytestmark = pytest.mark.jobhealth

JOB, COMM = "train-net", 0xDEAD0000000000A1
LINK = "eth1"


def backoff(cut: float, rto: float = 0.2, until: float = 1000.0) -> list[float]:
    """When a flow whose path died at ``cut`` retransmits: every unanswered
    retransmission doubles the timeout (capped at 120 s, as Linux does)."""
    times, at, timeout = [], cut, rto
    while at + timeout <= until:
        at += timeout
        times.append(at)
        timeout = min(2 * timeout, 120.0)
    return times


def rate_at(events: Sequence[float], now: float) -> float:
    """The rate the links observer shows at ``now``: the retransmissions of the last
    whole second before its latest read (reads on whole seconds)."""
    second = math.floor(now + 1e-9)
    return float(sum(1 for t in events if second - 1 <= t < second))


def reading(counts: dict[int, int], per_s: float = 0.0, *, network: bool = False,
            link: str = LINK) -> HostReading:
    ranks = tuple(RankReading((4000 + r, 3), str(r), c, ProcessState.SLEEPING)
                  for r, c in counts.items())
    return HostReading((JobReading(JOB, (CommReading(COMM, len(counts), ranks),)),),
                       network, ((link, per_s),))


class Clock:
    """The engine stepped every 0.1 s on a test clock; every change kept."""

    def __init__(self, cfg: JobHealthSection | None = None) -> None:
        self.engine = JobHealthEngine(cfg or JobHealthSection())
        self.now = 0.0
        self.changes: list[Change] = []

    def run(self, counts: dict[int, int], until: float, events: Sequence[float] = (),
            **kwargs: object) -> None:
        while self.now < until - 1e-9:
            self.now = round(self.now + 0.1, 6)
            step = self.engine.step(reading(counts, rate_at(events, self.now), **kwargs),
                                    self.now)
            self.changes += step.changes

    def cause(self) -> Cause | None:
        verdict = self.engine.judge.verdict(JOB, COMM)
        return verdict.cause if verdict else None

    def found(self) -> list[tuple[Finding, Cause]]:
        return [(c.verdict.finding, c.verdict.cause) for c in self.changes if c.active]


def moving(clock: Clock, until: float, events: Sequence[float] = ()) -> dict[int, int]:
    """Ranks 0-2 issuing 10 collectives a second up to ``until``."""
    counts = {0: 0, 1: 0, 2: 0}
    while clock.now < until - 1e-9:
        counts = {r: c + 1 for r, c in counts.items()}
        clock.run(counts, clock.now + 0.1, events)
    return counts


def test_item2_a_dead_path_under_a_hung_job_is_named_network_once_sustained() -> None:
    clock = Clock()
    counts = moving(clock, 10.0)
    frozen = {**counts, 2: counts[2] - 1}   # rank 2 waits for data that never comes
    dead = backoff(cut=10.0)
    clock.run(frozen, 14.0, dead)
    # The hang is named at hang_after, before the retransmissions could be told from
    # a burst: nothing is known at fault yet.
    assert clock.found() == [(Finding.HANG, Cause.UNKNOWN)]
    clock.run(frozen, 30.0, dead)
    assert clock.found() == [(Finding.HANG, Cause.UNKNOWN), (Finding.HANG, Cause.NETWORK)]
    (comm,) = clock.engine.jobs[JOB].comms.values()
    assert comm.dead_paths == (LINK,)
    assert [r.cause for r in clock.engine.judge.verdict(JOB, COMM).ranks] == [Cause.NETWORK]
    # Backoff spaces the retransmissions ever further apart (12.6 s, 25.4 s, 51 s after
    # the cut ...): the judgement holds between them, for minutes.
    clock.run(frozen, 300.0, dead)
    assert clock.cause() is Cause.NETWORK and len(clock.found()) == 2


def test_item2_every_rank_stalled_on_a_dead_path_is_a_network_stall_not_paused() -> None:
    clock = Clock(JobHealthSection(stall_after=20.0))
    counts = moving(clock, 5.0)
    clock.run(counts, 40.0, backoff(cut=5.0))
    assert clock.found() == [(Finding.STALL, Cause.NETWORK)]


def test_item2_a_single_burst_of_retransmissions_is_never_the_network() -> None:
    """Every rank paused together (evaluation) on a healthy network: the flows' last
    losses are retransmitted at once, and nothing after."""
    clock = Clock(JobHealthSection(stall_after=20.0))
    counts = moving(clock, 5.0)
    burst = [5.3 + i * 0.001 for i in range(200)]
    clock.run(counts, 40.0, burst)
    assert clock.found() == [(Finding.STALL, Cause.PAUSED)]
    clock.run({**counts, 0: counts[0] + 1, 1: counts[1] + 1}, 40.1)  # two ranks move on
    clock.run({**counts, 0: counts[0] + 1, 1: counts[1] + 1}, 50.0, [45.0 + i * 0.001
                                                                    for i in range(200)])
    assert clock.found()[-1] == (Finding.HANG, Cause.UNKNOWN)


def test_item2_two_stray_retransmissions_far_apart_are_not_sustained() -> None:
    clock = Clock()
    counts = moving(clock, 5.0)
    frozen = {**counts, 1: counts[1] - 1}
    clock.run(frozen, 60.0, [6.0, 20.0])
    assert clock.found() == [(Finding.HANG, Cause.UNKNOWN)]


def test_item2_retransmissions_that_stopped_stop_counting_at_their_deadline() -> None:
    """A path that died and came back while the job stayed still for another reason:
    the judgement lapses once the gap since the last retransmission outgrows backoff."""
    clock = Clock(JobHealthSection(report_interval=3600.0))
    counts = moving(clock, 5.0)
    frozen = {**counts, 1: counts[1] - 1}
    healed = [t for t in backoff(cut=5.0) if t < 12.0]    # 5.2 ... 11.2, then delivered
    clock.run(frozen, 14.0, healed)
    assert clock.cause() is Cause.NETWORK
    # Seen from the read at 6.0 to the pass before the read at 13.0 shows none: the gap
    # may grow to that span plus the window.
    lapse = clock.engine.next_deadline()
    assert lapse == pytest.approx(12.9 + (12.9 - 6.0) + 5.0)
    clock.run(frozen, lapse - 0.1, healed)   # the pass before it
    assert clock.cause() is Cause.NETWORK
    clock.run(frozen, lapse, healed)         # the pass at it: time alone changed it
    assert clock.cause() is Cause.UNKNOWN
    assert clock.found()[-1] == (Finding.HANG, Cause.UNKNOWN)


def test_item2_a_busy_links_losses_before_the_job_stopped_do_not_count() -> None:
    clock = Clock()
    lossy = [t / 10 for t in range(0, 100)]                # 10 a second while it moves
    counts = moving(clock, 10.0, lossy)
    clock.run({**counts, 2: counts[2] - 1}, 40.0, lossy)   # the job stops; so do they
    assert clock.found() == [(Finding.HANG, Cause.UNKNOWN)]


def test_item2_a_progressing_jobs_straggler_is_never_named_network_from_retransmits() -> None:
    """Stragglers are the one finding of a moving job: a busy link's steady losses
    (retransmitted all along) say nothing about why one rank lags."""
    clock = Clock(JobHealthSection(straggler_margin=1.0, straggler_window=10.0))
    lossy = [t / 5 for t in range(0, 400)]                 # 5 a second, all the time
    counts = {0: 0, 1: 0, 2: 0}
    while clock.now < 60.0 - 1e-9:
        high = counts[0] + 1
        counts = {0: high, 1: high, 2: max(0, high - 15)}  # 1.5 s behind at 10 a second
        clock.run(counts, clock.now + 0.1, lossy)
    assert clock.found() == [(Finding.STRAGGLER, Cause.UNKNOWN)]


def test_item2_a_link_down_or_erroring_is_the_network_at_once_as_before() -> None:
    clock = Clock()
    counts = moving(clock, 5.0)
    clock.run({**counts, 1: counts[1] - 1}, 9.0, network=True)
    assert clock.found() == [(Finding.HANG, Cause.NETWORK)]


def test_item3_a_reload_judges_the_evidence_by_the_new_window_at_once() -> None:
    clock = Clock()
    counts = moving(clock, 5.0)
    frozen = {**counts, 1: counts[1] - 1}
    dead = backoff(cut=5.0)
    clock.run(frozen, 30.0, dead)
    assert clock.cause() is Cause.NETWORK
    clock.engine.configure(JobHealthSection(retransmit_window=60.0))
    clock.run(frozen, 30.1, dead)
    assert clock.cause() is Cause.UNKNOWN      # 13 s of retransmissions: under 60 s
    clock.engine.configure(JobHealthSection(retransmit_window=10.0, retransmit_segments=50))
    clock.run(frozen, 30.2, dead)
    assert clock.cause() is Cause.UNKNOWN      # 6 segments: under 50
    clock.engine.configure(JobHealthSection(retransmit_window=10.0))
    clock.run(frozen, 30.3, dead)
    assert clock.cause() is Cause.NETWORK


def test_item3_only_data_links_that_are_up_carry_retransmissions_to_job_health() -> None:
    """The links domain hands its rates on beside its levels (its other users unchanged);
    job health takes those of up data links."""
    links = LinkHealthEngine(LinksSection())
    step = links.step([LinkView("eth1", "data", True, 0.0, 0.0, 0.5, 0.0, 2.0, 1.0),
                       LinkView("eth9", "storage", True, 0.0, 0.0, 0.5, 0.0, 2.0, 9.0),
                       LinkView("eth2", "data", False, None, 0.0, 0.0, 0.0, 0.0, 3.0)], 0.0)
    assert [(lv.name, lv.retransmits_per_s) for lv in step.links] == [
        ("eth1", 1.0), ("eth9", 9.0), ("eth2", 3.0)]
    assert step.links[0].congestion is Level.NONE  # under min_packets_per_s: not judged
    assert data_retransmits(step.links) == (("eth1", 1.0),)


def test_item3_retransmit_settings_load_and_refuse_bad_values_in_one_line(
        tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[jobhealth]\nretransmit_window = 8\n")
    cfg, _ = load(path)
    assert (cfg.jobhealth.retransmit_window, cfg.jobhealth.retransmit_segments) == (8.0, 4)
    for text, named in (("retransmit_window = 1.0", "retransmit_window"),
                        ("retransmit_segments = 0", "retransmit_segments"),
                        ("retransmit_segments = 'many'", "retransmit_segments")):
        path.write_text(f"[jobhealth]\n{text}\n")
        with pytest.raises(ConfigError) as caught:
            load(path)
        assert named in str(caught.value) and "\n" not in str(caught.value)


@given(st.floats(0.0, 60.0), st.floats(0.0, 1.0), st.integers(1, 100_000))
@settings(max_examples=200, deadline=None)
def test_item2_no_burst_within_a_second_is_sustained_even_at_the_loosest_settings(
        start: float, length: float, size: int) -> None:
    """``size`` segments retransmitted between ``start`` and ``start + length``: read
    once a second, the rates stand for at most two seconds, under the least window."""
    per_second = Counter(math.floor(start + length * i / 10) for i in range(11))
    watch = RetransmitWatch(window=3.0, segments=1)
    now = 0.0
    while now < 120.0:
        now = round(now + 0.1, 6)
        seen = per_second.get(math.floor(now + 1e-9) - 1, 0)
        watch.observe([(LINK, size * seen / 11)], now)
        assert watch.dead_paths(0.0, now) == ()


@given(st.lists(st.tuples(st.floats(0.01, 8.0), st.booleans(), st.floats(0.0, 20.0)),
                min_size=1, max_size=60))
@settings(max_examples=200, deadline=None)
def test_item3_the_next_deadline_is_never_already_past_with_retransmissions(
        moves: list[tuple[float, bool, float]]) -> None:
    engine = JobHealthEngine(JobHealthSection(hang_after=1.0, stall_after=10.0,
                                              retransmit_window=2.0, retransmit_segments=1))
    counts = {0: 0, 1: 1}
    now = 0.0
    for dt, moved, per_s in moves:
        now += dt
        if moved:
            counts[0] += 1
        engine.step(reading(counts, per_s), now)
        deadline = engine.next_deadline()
        assert deadline is None or deadline > now
