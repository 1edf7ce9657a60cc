"""Redaction per kind of message, each rule to the letter (controller/redactionconfig.py,
controller/poolredaction.py, controller/jobredaction.py): names and settings, pool
capacity in every mode, and what a job's own tenant is told."""

from __future__ import annotations

import pytest

from controller.jobredaction import NOTICE_HORIZON, energy_saved, rebuilt_notice
from controller.poolredaction import (
    around,
    private_capacity,
    shaped_capacities,
    trend,
    true_counts,
)
from controller.pooltally import counted
from controller.privacy import Plan, margin, release_epsilon
from controller.redaction import Redactor
from controller.redactionconfig import Mode, PoolNames, PoolPrivacy, RedactionConfig, bucket
from controller.types import HostState, Member, Placement
from harmonaize.messages import (
    Bucket,
    GpuCounts,
    JobEnergy,
    JobHealth,
    NoticeStatus,
    PoolCapacity,
    Trend,
    ValidationNotice,
)

pytestmark = [pytest.mark.controller, pytest.mark.architecture]


def host(name: str, *, pool: str = "p", gpus: int = 8, busy: int = 0, alive: bool = True,
         energy: tuple[JobEnergy, ...] = ()) -> HostState:
    return HostState(name, pool, "h100", alive, gpus=GpuCounts(healthy=gpus, in_use=busy),
                     energy=energy)


def test_only_declared_pool_and_class_names_are_ours_and_declare_a_topic() -> None:
    names = PoolNames.of(["p"], ["h100"])
    assert names.own("p", "h100") == ("p", "h100")
    assert names.own("p", "a100") is None and names.own("q", "h100") is None
    assert names.declares("pool/p/h100")
    for topic in ("pool/p/a100", "pool/q/h100", "pool/p", "pool/p/h100/x", "job/p/h100"[:0]):
        assert not names.declares(topic)


def test_bucket_edges_and_the_release_interval_are_checked() -> None:
    for bad in ({"host_buckets": (1, 2)}, {"gpu_buckets": (0, 4, 4)},
                {"energy_buckets": (0, 5, 2)}, {"release_interval": 86401.0}):
        with pytest.raises(ValueError, match="must"):
            RedactionConfig(**bad)  # type: ignore[arg-type]
    assert RedactionConfig(release_interval=86400.0).release_interval == 86400.0


def test_redacted_capacity_needs_min_hosts_and_full_mode_counts_every_pool_exactly() -> None:
    hosts = [host("a", busy=2), host("b", alive=False), host("c", pool="small")]
    redacted = RedactionConfig(mode=Mode.REDACTED, min_hosts=2)
    ((topic, body),) = shaped_capacities(redacted, counted(hosts, redacted.host_gpus))
    assert topic == "pool/p/h100"
    assert (body.hosts_up, body.hosts_down, body.gpus_available) == (
        bucket(1, redacted.host_buckets), bucket(1, redacted.host_buckets),
        bucket(6, redacted.gpu_buckets))
    full = dict(shaped_capacities(RedactionConfig(mode=Mode.FULL, min_hosts=5),
                                  counted(hosts, 8)))
    assert sorted(full) == ["pool/p/h100", "pool/small/h100"]
    assert (full["pool/p/h100"].hosts_up, full["pool/p/h100"].hosts_down,
            full["pool/p/h100"].gpus_available) == (Bucket(1, 1), Bucket(1, 1), Bucket(6, 6))
    assert full["pool/small/h100"].trend is Trend.STEADY


def test_a_trend_is_the_direction_of_the_last_published_move() -> None:
    def cap(gpus: int, up: int) -> PoolCapacity:
        return PoolCapacity("p", "h100", Bucket(up, up), Bucket(0, 0), Bucket(gpus, gpus),
                            Trend.STEADY, 0)
    assert trend(cap(8, 1), cap(16, 1), Trend.FALLING) is Trend.RISING
    assert trend(cap(8, 2), cap(8, 1), Trend.RISING) is Trend.FALLING
    assert trend(cap(8, 1), cap(8, 1), Trend.FALLING) is Trend.FALLING
    assert trend(None, cap(8, 1), Trend.RISING) is Trend.RISING


def test_true_counts_clamp_each_hosts_gpus_and_leave_out_small_pools() -> None:
    cfg = RedactionConfig(host_gpus=4, min_hosts=2)
    hosts = [host("a", gpus=8), host("b", gpus=2), host("c", alive=False),
             host("d", pool="small")]
    assert true_counts(cfg, counted(hosts, cfg.host_gpus)) == {
        "pool/p/h100": ("p", "h100", 6, 2, 1)}


def test_a_private_release_is_the_range_around_each_noisy_count() -> None:
    def plus(shift: int):  # a sampler that adds a fixed amount: the noise made visible
        return lambda value, scale: value + shift
    gpus_only = Plan(12.0, 900.0, 8, 1.0)
    body = private_capacity(("p", "h100", 40, 5, 1), gpus_only, plus(3))
    m = margin(gpus_only.gpu_scale)
    assert (body.pool, body.gpu_class, body.trend, body.revision) == ("p", "h100",
                                                                      Trend.STEADY, 0)
    assert body.gpus_available == Bucket(max(0, 43 - m), 43 + m)
    assert body.hosts_up == body.hosts_down == Bucket(0, None)
    split = Plan(12.0, 900.0, 8, 0.5)
    assert split.host_scale is not None
    body = private_capacity(("p", "h100", 40, 5, 1), split, plus(-2))
    k = margin(split.host_scale)
    assert body.hosts_up == Bucket(max(0, 3 - k), 3 + k)
    assert body.hosts_down == Bucket(0, max(0, -1 + k))
    n = margin(2.0)
    assert n > 0
    assert around(5, 2.0) == Bucket(max(0, 5 - n), 5 + n)
    assert around(-n - 1, 2.0) == Bucket(0, 0)


def test_the_energy_saved_is_told_as_a_range_once_enough_is_measured_on_the_jobs_hosts() -> None:
    cfg = RedactionConfig(energy_min_kj=100)
    placed = Placement("j", "t", (Member("0", "a"), Member("1", "b")))
    hosts = {"a": host("a", energy=(JobEnergy("j", 60, 30), JobEnergy("k", 500, 500))),
             "b": host("b", energy=(JobEnergy("j", 6, 4),)),
             "c": host("c", energy=(JobEnergy("j", 1000, 1000),))}  # not the job's host
    assert energy_saved(cfg, placed, hosts) == bucket(34, cfg.energy_buckets)
    assert energy_saved(RedactionConfig(energy_min_kj=100), placed, {"a": host("a")}) is None
    assert energy_saved(RedactionConfig(energy_min_kj=100), placed, {
        "a": host("a", energy=(JobEnergy("j", 50, 49),))}) is None  # 99 kJ: not yet
    assert energy_saved(RedactionConfig(energy_min_kj=0), placed, {
        "a": host("a", energy=(JobEnergy("j", 0, 1),))}) == bucket(100, cfg.energy_buckets)


def test_a_notice_is_rebuilt_within_its_bounds_or_refused_with_why() -> None:
    cfg = RedactionConfig(undeclared_max_pause=600.0)
    placements = {"j": Placement("j", "t", (Member("0", "a"), Member("1", "a"),
                                            Member("2", "b")))}
    wall = 1000.0

    def notice(pause: int, starts: float, status: NoticeStatus = NoticeStatus.SCHEDULED,
               members: tuple[str, ...] = ("1",)) -> ValidationNotice:
        return ValidationNotice("j", members, pause, starts, "x", starts, status, 0.0)

    def rebuilt(n: ValidationNotice, host_id: str = "a", max_pause: float | None = None,
                max_defer: float = 0.0) -> ValidationNotice | str:
        found = rebuilt_notice(cfg, placements, host_id, n, wall, max_pause=max_pause,
                               notice_id="n1", defer_seconds=30.0, max_defer=max_defer)
        return found if isinstance(found, str) else found[1]

    body = rebuilt(notice(60, 1200.0))
    assert isinstance(body, ValidationNotice)
    assert (body.members, body.pause_seconds, body.starts_at, body.id, body.defer_seconds) \
        == (("1",), 60, 1200.0, "n1", 30.0)
    assert rebuilt(notice(0, 1200.0)) == "pause_not_allowed"
    assert rebuilt(notice(601, 1200.0)) == "pause_not_allowed"
    assert isinstance(rebuilt(notice(600, 1200.0)), ValidationNotice)
    assert rebuilt(notice(61, 1200.0), max_pause=60.0) == "pause_not_allowed"
    early = rebuilt(notice(60, 10.0))
    late = rebuilt(notice(60, 1e9), max_defer=100.0)
    assert isinstance(early, ValidationNotice) and isinstance(late, ValidationNotice)
    assert early.starts_at == wall and late.starts_at == wall + NOTICE_HORIZON + 100.0
    running = rebuilt(notice(60, 1200.0, NoticeStatus.STARTED, members=("9",)))
    assert isinstance(running, ValidationNotice)
    assert running.defer_seconds == 0.0 and running.members == ("0", "1")
    assert rebuilt(notice(60, 1200.0), host_id="z") == "not_placed_here"


# --- the redactor's own state: budgets, restored conditions, declared names -------------


def test_each_private_pools_budget_spending_and_next_release_are_shown() -> None:
    cfg = RedactionConfig()
    redactor = Redactor(cfg, sampler=lambda value, scale: value)
    redactor.observe([host("a"), host("b")], 0.0)
    plan = redactor.plan("pool/p/h100")
    # Two hosts: 12 x 0.05 x 2 = 1.2 releases a day would fit the noise within a
    # twentieth of their 16 GPUs; max_release_interval (6 h) allows no fewer than 4.
    assert plan == Plan(cfg.epsilon_per_day, 86400 / 4, cfg.host_gpus, cfg.gpu_share)
    # The cap wins over the noise target: 4 releases of 12/4 each, scale 8 x 4 / 12 GPUs.
    assert plan.gpu_scale == cfg.host_gpus * 4 / cfg.epsilon_per_day > cfg.noise_share * 16
    interval = plan.release_interval
    eps = release_epsilon(plan)
    assert redactor.privacy(100.0) == [PoolPrivacy(
        "p", "h100", cfg.epsilon_per_day, 0.0, 0, eps, interval, 2, plan.gpu_scale,
        plan.host_scale, interval - 100.0)]
    assert redactor.next_due() == interval
    (release,) = redactor.due(interval)
    assert release.topic == "pool/p/h100" and release.tenant is None
    (shown,) = redactor.privacy(interval + 1.0)
    assert (shown.spent, shown.releases, shown.next_release_in) == pytest.approx(
        (eps, 1, interval - 1.0))


def test_a_restored_condition_goes_on_from_its_revision_and_trend() -> None:
    redactor = Redactor(RedactionConfig(mode=Mode.FULL))
    told = PoolCapacity("p", "h100", Bucket(1, 1), Bucket(0, 0), Bucket(8, 8), Trend.RISING, 7)
    redactor.restore("pool/p/h100", told)
    redactor.restore("job/t/j/", JobHealth("j", revision=3))
    redactor.restore("job/t/k/", ValidationNotice("k", ("0",), 60, 1.0, "n", 1.0,
                                                  NoticeStatus.SCHEDULED, 0.0))
    assert [(p.topic, p.body.revision, p.tenant) for p in redactor.current()] == [
        ("job/t/j/", 3, "t"), ("pool/p/h100", 7, None)]
    redactor.observe([host("a")], 1.0)  # the same capacity: nothing new to tell
    assert redactor.due(1.0) == []
    redactor.observe([host("a", busy=8)], 2.0)
    (update,) = redactor.due(2.0)
    assert (update.body.revision, update.body.trend) == (8, Trend.FALLING)


def test_pool_topics_of_names_no_longer_declared_are_forgotten() -> None:
    redactor = Redactor(RedactionConfig(mode=Mode.FULL))
    assert redactor.forget_undeclared() == []  # no names: every name is the simulator's
    redactor.names = PoolNames.of(["p"], ["h100"])
    for pool in ("p", "q"):
        redactor.restore(f"pool/{pool}/h100", PoolCapacity(
            pool, "h100", Bucket(1, 1), Bucket(0, 0), Bucket(8, 8), Trend.STEADY, 1))
    redactor.restore("job/t/j/", JobHealth("j", revision=1))
    assert redactor.forget_undeclared() == ["pool/q/h100"]
    assert [p.topic for p in redactor.current()] == ["job/t/j/", "pool/p/h100"]
    redactor.observe([host("a", busy=2), host("x", pool="q")], 1.0)
    assert redactor.held_back == {("q", "h100"): 1}  # its host counts in no pool
    assert [p.topic for p in redactor.due(1.0)] == ["pool/p/h100"]
