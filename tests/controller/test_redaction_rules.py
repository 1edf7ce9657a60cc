"""The redaction rules to the letter: exact publications, times, revisions and
trends, so that a change to any rule shows (these pin what mutation testing
found unpinned)."""

from __future__ import annotations

import random

import pytest

from controller.redaction import Redactor
from controller.redactionconfig import Mode, RedactionConfig, bucket
from controller.types import HostState, Member, Placement, Publication
from harmonaize.messages import (
    Advice,
    Bucket,
    GpuCounts,
    Health,
    JobAdvisory,
    JobHealth,
    Level,
    LinkHealth,
    PoolCapacity,
    Trend,
    TuningStatus,
    Urgency,
    ValidationNotice,
)

pytestmark = [pytest.mark.controller, pytest.mark.hardening]


class Drawn(random.Random):
    """Draws three quarters of the way up every range, and counts its draws."""

    def __init__(self) -> None:
        super().__init__(0)
        self.draws = 0

    def uniform(self, a: float, b: float) -> float:
        self.draws += 1
        return a + 0.75 * (b - a)


def host(name: str, pool: str = "p", *, alive: bool = True, gpus: int = 8,
         schedulable: bool = True, health: Health = Health.HEALTHY, quarantined: int = 0,
         lost: int = 0, links: tuple[LinkHealth, ...] = ()) -> HostState:
    return HostState(name, pool, "H200", alive, schedulable, health,
                     GpuCounts(healthy=gpus, quarantined=quarantined, lost=lost), links)


def capacity(up: Bucket, down: Bucket, gpus: Bucket, trend: Trend, revision: int
             ) -> PoolCapacity:
    return PoolCapacity("p", "H200", up, down, gpus, trend, revision)


def test_capacity_updates_are_exact_delayed_jittered_and_trend_their_way() -> None:
    rng = Drawn()
    red = Redactor(RedactionConfig(mode=Mode.REDACTED, min_hosts=2, min_interval=10.0,
                                   jitter=2.0), rng)
    # Pool "a" has too few hosts to publish; it sorts first and must not stop pool "p".
    fleet = [host("a0", "a"), *(host(f"p{i}") for i in range(8))]
    red.observe(fleet, 0.0)
    assert red.due(1.4) == []
    first = capacity(Bucket(8, 15), Bucket(0, 1), Bucket(64, 127), Trend.STEADY, 1)
    assert red.due(1.5) == [Publication("pool/p/H200", first, None, 1.5)]
    half = [*fleet[:5], *(host(f"p{i}", alive=False) for i in range(4, 8))]
    red.observe(half, 5.0)
    assert red.next_due() == 13.0  # the last update + min_interval, + 3/4 of the jitter
    fallen = capacity(Bucket(4, 7), Bucket(4, 7), Bucket(32, 63), Trend.FALLING, 2)
    assert red.due(13.0) == [Publication("pool/p/H200", fallen, None, 13.0)]
    red.observe(fleet, 20.0)
    risen = capacity(Bucket(8, 15), Bucket(0, 1), Bucket(64, 127), Trend.RISING, 3)
    assert red.due(24.5) == [Publication("pool/p/H200", risen, None, 24.5)]
    # Down and back before the update was due: nobody is told anything.
    red.observe(half, 30.0)
    red.observe(fleet, 31.0)
    assert red.due(1000.0) == []
    assert red.next_due() is None
    # The same content again is no update either, however often it is observed.
    red.observe(fleet, 2000.0)
    assert red.due(5000.0) == []
    assert rng.draws == 4  # one draw per scheduled update, none for no change


def test_without_jitter_nothing_is_drawn_and_updates_come_at_the_interval() -> None:
    rng = Drawn()
    red = Redactor(RedactionConfig(mode=Mode.REDACTED, min_hosts=1, min_interval=10.0,
                                   jitter=0.0), rng)
    red.observe([host("p0")], 3.0)
    assert [p.at for p in red.due(3.0)] == [3.0]
    red.observe([host("p0", alive=False)], 4.0)
    assert red.next_due() == 13.0
    assert rng.draws == 0


def test_job_health_names_each_member_by_its_hosts_state() -> None:
    red = Redactor(RedactionConfig(mode=Mode.REDACTED, min_hosts=100), random.Random(1))
    red.place(Placement("job-1", "acme", (
        Member("0", "gone"), Member("1", "quarantining"), Member("2", "drained"),
        Member("3", "congested"), Member("4", "fine"))))
    hosts = [
        host("gone", alive=False),
        host("quarantining", quarantined=1),
        host("drained", schedulable=False),
        host("congested", links=(LinkHealth("data", 4, 0, Level.LOW, Level.NONE),
                                 LinkHealth("mgmt", 1, 0, Level.HIGH, Level.NONE))),
        host("fine"),
    ]
    red.observe(hosts, 7.0)
    expected = JobHealth("job-1", ("1", "2"), ("0",), Level.LOW, 1, "default",
                         TuningStatus.STEADY)
    assert red.due(7.0) == [Publication("job/acme/job-1/", expected, "acme", 7.0)]
    assert red.tuning("job-1", "congested", TuningStatus.PAUSED) is True
    assert red.tuning("job-1", "congested", TuningStatus.PAUSED) is False
    red.observe(hosts, 8.0)
    paused = JobHealth("job-1", ("1", "2"), ("0",), Level.LOW, 2, "congested",
                       TuningStatus.PAUSED)
    assert red.due(8.0) == [Publication("job/acme/job-1/", paused, "acme", 8.0)]
    # What late joiners are given: the present, by prefix, with its owner and time.
    assert red.current("job/") == [Publication("job/acme/job-1/", paused, "acme", 8.0)]
    assert red.current("pool/") == []
    red.place(Placement("job-2", "acme", (Member("0", "fine"),)))
    red.observe(hosts, 8.5)
    red.due(8.5)
    red.remove_job("job-1")
    red.remove_job("job-unknown")  # nothing to forget: no error
    assert [p.topic for p in red.current()] == ["job/acme/job-2/"]  # only job-1 went
    assert "job-1" not in red.placements
    red.remove_job("job-2")
    red.observe(hosts, 9.0)
    assert red.due(9.0) == []
    # Placed again, it starts afresh: its retuning state went with it.
    red.place(Placement("job-1", "acme", (Member("4", "fine"),)))
    red.observe(hosts, 10.0)
    (again,) = red.due(10.0)
    assert (again.body.tuning_choice, again.body.tuning) == ("default", TuningStatus.STEADY)


def test_observing_some_jobs_recomputes_only_theirs_in_the_order_given() -> None:
    red = Redactor(RedactionConfig(mode=Mode.REDACTED, min_hosts=100), random.Random(1))
    for job in ("job-a", "job-b", "job-c"):
        red.place(Placement(job, "acme", (Member("0", "h1"),)))
    red.observe([host("h1", alive=False)], 1.0, jobs=["job-c", "job-gone", "job-a"])
    assert [(p.topic, p.body.lost) for p in red.due(1.0)] == [
        ("job/acme/job-c/", ("0",)), ("job/acme/job-a/", ("0",))]
    assert set(red.placements) == {"job-a", "job-b", "job-c"}  # all still placed
    red.observe([host("h1", alive=False)], 2.0)  # all of them: only job-b is news
    assert [p.topic for p in red.due(2.0)] == ["job/acme/job-b/"]


def test_bucket_edges_are_checked_and_the_top_bucket_is_open() -> None:
    for bad in ((1, 2, 4), (0, 2, 2, 4), (0, 4, 2)):
        with pytest.raises(ValueError, match="host_buckets must start at 0 and increase"):
            RedactionConfig(host_buckets=bad)
        with pytest.raises(ValueError, match="gpu_buckets must start at 0 and increase"):
            RedactionConfig(gpu_buckets=bad)
    edges = (0, 2, 4, 8)
    assert bucket(7, edges) == Bucket(4, 7)
    assert bucket(8, edges) == Bucket(8, None)
    assert bucket(3, edges) == Bucket(2, 3)


def test_advice_and_notices_are_rebuilt_field_by_field() -> None:
    red = Redactor(RedactionConfig(undeclared_max_pause=1800.0), random.Random(1))
    red.place(Placement("job-1", "acme", (Member("0", "g1"),)))
    assert red.advisory("g1", JobAdvisory("job-1", Advice.CHECKPOINT_NOW, "thermal",
                                          Urgency.ELEVATED, ("0",)), 3.0, 1e9) is None
    assert red.due(3.0) == [Publication("job/acme/job-1/", JobAdvisory(
        "job-1", Advice.CHECKPOINT_NOW, "thermal", Urgency.ELEVATED, ("0",)), "acme", 3.0)]
    wall = 1.8e9

    def notice(pause: int, starts: float = wall + 30.0) -> ValidationNotice:
        return ValidationNotice("job-1", ("0",), pause, starts)

    assert red.advisory("g1", notice(0), 4.0, wall, max_pause=600) == "pause_not_allowed"
    assert red.advisory("g1", notice(1), 4.0, wall, max_pause=600) is None
    assert red.advisory("g1", notice(1000), 4.0, wall, max_pause=600) == "pause_not_allowed"
    assert red.advisory("g1", notice(1000, wall + 30.123456), 4.0, wall) is None  # 1800 cap
    one, thousand = red.due(4.0)
    # not_before is the start too (the controller's, rounded), with no id or deferral
    # unless the controller gives them.
    assert one == Publication("job/acme/job-1/", ValidationNotice(
        "job-1", ("0",), 1, wall + 30.0, "", wall + 30.0), "acme", 4.0)
    assert thousand.body == ValidationNotice("job-1", ("0",), 1000, wall + 30.123, "",
                                             wall + 30.123)


def test_a_pending_update_is_replaced_by_newer_content_and_keeps_its_time() -> None:
    red = Redactor(RedactionConfig(mode=Mode.REDACTED, min_hosts=2, min_interval=10.0,
                                   jitter=2.0), Drawn())
    fleet = [host(f"p{i}") for i in range(8)]
    red.observe(fleet, 0.0)
    red.due(1.5)
    four = [*fleet[:4], *(host(f"p{i}", alive=False) for i in range(4, 8))]
    red.observe(four, 5.0)
    red.observe(four, 6.0)  # the same again while it waits: still one update
    six = [*fleet[:2], *(host(f"p{i}", alive=False) for i in range(2, 8))]
    red.observe(six, 7.0)  # newer content: it replaces the waiting one, at the same time
    (update,) = red.due(13.0)
    assert update.at == 13.0
    assert update.body == capacity(Bucket(2, 3), Bucket(4, 7), Bucket(16, 31),
                                   Trend.FALLING, 3)
    # Hosts added, down: only the down count moves, and the trend stays as it was.
    red.observe([*six, host("p8", alive=False), host("p9", alive=False)], 30.0)
    (more,) = red.due(100.0)
    assert more.body == capacity(Bucket(2, 3), Bucket(8, 15), Bucket(16, 31),
                                 Trend.FALLING, 4)


def test_full_mode_counts_exactly_at_once() -> None:
    red = Redactor(RedactionConfig(mode=Mode.FULL), random.Random(1))
    red.observe([host("p0"), host("p1"), host("p2", alive=False)], 2.0)
    assert red.due(2.0) == [Publication("pool/p/H200", capacity(
        Bucket(2, 2), Bucket(1, 1), Bucket(16, 16), Trend.STEADY, 1), None, 2.0)]
