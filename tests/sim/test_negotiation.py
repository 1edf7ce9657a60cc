"""The negotiation regime in the simulator, on small hand-made traces with outcomes
worked out by hand: holds kept out of what others get, a no-show's hosts idle until its
hold expires, maintenance at a checkpoint against notice-only, and the prober's answers
as a function of its releases alone."""

from __future__ import annotations

import math

import pytest

from controller.negotiation.capacity import allowance
from controller.redactionconfig import Mode, RedactionConfig
from sim import regimes
from sim.cluster import FaultSpec, size_cluster
from sim.engine import Simulation
from sim.model import SimConfig
from sim.negotiation import NegotiationPlan, cause_of
from sim.negotiation_metrics import figures, jain
from sim.probing import seen_by_prober
from sim.traces import JobSpec

pytestmark = [pytest.mark.sim, pytest.mark.negotiation]

FULL = RedactionConfig(mode=Mode.FULL)


def config(nodes: int, **kw) -> SimConfig:
    base = {"nodes_per_pool": (("p", nodes),), "congestion_per_rack_day": 0.0,
            "observe_batch_s": 0.0, "elastic_fraction": 0.0, "tenants": ("a", "b"),
            "ckpt_interval": 1e12}  # no checkpoint unless a test asks for them
    base.update(kw)
    return SimConfig(**base)


def job(i: int, arrival: float, duration: float, gpus: int, tenant: str) -> JobSpec:
    return JobSpec(i, float(arrival), float(duration), gpus, "p", tenant)


def simulation(cfg: SimConfig, jobs: list[JobSpec], regime: regimes.Regime,
               faults: tuple[FaultSpec, ...] = ()) -> Simulation:
    return Simulation(cfg, size_cluster(jobs, cfg), jobs, regime, faults=faults)


# A 16-GPU gang job of tenant a arrives at 5000 s; tenant b fills the pool's four hosts
# with 10000-second jobs at 2000 s. Planned 4000 s ahead, a's proposal (at 1000 s, the
# pool empty: its share, half of 32, is 16) is offered and accepted.
GANG = [job(0, 5000, 1000, 16, "a")] + [job(i, 2000, 10000, 8, "b") for i in range(1, 5)]


def plan(**kw) -> NegotiationPlan:
    return NegotiationPlan(**{"lead_s": 4000.0, "no_show_rate": 0.0, **kw})


def test_a_hold_keeps_hosts_out_of_what_others_get() -> None:
    starts_without = [j.first_start for j in
                      simulation(config(4), GANG, regimes.full()).run().jobs]
    sim = simulation(config(4), GANG, regimes.negotiated(plan(), redaction=FULL))
    result = sim.run()
    starts = [j.first_start for j in result.jobs]
    # without: b takes every host at 2000 s and the gang job waits for them to end
    assert starts_without == [12000.0, 2000.0, 2000.0, 2000.0, 2000.0]
    # with: two hosts are kept; the gang job starts on arrival, b's last two after it
    assert starts[0] == 5000.0
    assert sorted(starts[1:]) == [2000.0, 2000.0, 6000.0, 6000.0]
    c = result.negotiation
    assert (c["holds"], c["honoured"], c["not_honoured"], c["no_shows"]) == (1, 1, 0, 0)
    assert sim.negotiator is not None and not sim.negotiator.holds()


def test_a_no_show_keeps_its_hosts_idle_until_its_hold_expires_and_is_charged() -> None:
    sim = simulation(config(4), GANG,
                     regimes.negotiated(plan(no_show_rate=1.0), redaction=FULL))
    result = sim.run()
    starts = [j.first_start for j in result.jobs]
    # the hold (window from 5000 s, grace 900 s) keeps two hosts until 5900 s; the
    # job came as an ordinary one, behind b's two waiting jobs
    assert sorted(starts[1:]) == [2000.0, 2000.0, 5900.0, 5900.0]
    assert starts[0] == 12000.0
    assert result.negotiation["no_shows"] == 1 and result.negotiation["honoured"] == 0
    assert sim.negotiator is not None
    assert sim.negotiator.records["a"].no_show == pytest.approx(16 * 1000.0)


def test_a_hold_kept_only_from_shortly_before_its_start_can_go_unhonoured() -> None:
    # kept from 1000 s before its start (4000 s): b took every host at 2000 s, none frees
    # within the grace, so the provider cancels the hold and the job waits as before
    result = simulation(config(4), GANG, regimes.negotiated(plan(drain_s=1000.0),
                                                            redaction=FULL)).run()
    c = result.negotiation
    assert (c["holds"], c["honoured"], c["not_honoured"]) == (1, 0, 1)
    assert result.jobs[0].first_start == 12000.0


def test_a_refused_tenant_asks_again_at_the_next_release() -> None:
    # b holds three hosts from 0 to 3000 s: at 1000 s the release says 8 free, so 16 is
    # above the most the pool could hold (an error naming max_count); when they free, the
    # next release says 32 and a's proposal again is offered and held
    jobs = [job(0, 5000, 1000, 16, "a")] + [job(i, 0, 3000, 8, "b") for i in range(1, 4)]
    result = simulation(config(4), jobs,
                        regimes.negotiated(plan(), redaction=FULL)).run()
    c = result.negotiation
    assert (c["proposals"], c["errors"], c["holds"], c["honoured"]) == (2, 1, 1, 1)
    assert result.jobs[0].first_start == 5000.0


def maintenance_run(mode: str) -> Simulation:
    # one job on one host; the host degrades at 5000 s (a link trained down: a notice
    # with 1800 s of least notice). Checkpoints complete every 3660 s of wall time.
    cfg = config(1, ckpt_interval=3600.0, ckpt_cost=60.0)
    fault = FaultSpec(0, 5000.0, 6000.0, True, None, "NIC", "NIC Link Speed low")
    sim = simulation(cfg, [job(0, 0, 20000, 8, "a")],
                     regimes.negotiated(NegotiationPlan(reservations=False,
                                                        maintenance=mode)), (fault,))
    sim.run()
    return sim


def test_maintenance_at_the_next_checkpoint_loses_no_work_notice_only_does() -> None:
    notice, ckpt = maintenance_run("notice"), maintenance_run("checkpoint")
    n, c = notice.nstats, ckpt.nstats
    assert n.maintained == c.maintained == 1
    # notice-only: stopped at 6800 s, 3140 s of computing since the checkpoint at 3660 s
    # (1000 s of it on the degraded host at 0.6 speed)
    assert n.maintained_clean == 0
    assert n.maintenance_lost_gpu_s == pytest.approx(8 * (2140 + 1000 * 0.6), rel=1e-6)
    # negotiated: moved to the checkpoint at 7320 s, nothing lost
    assert c.maintained_clean == 1 and c.maintenance_lost_gpu_s < 8 * 1.0
    assert ckpt.jobs[0].finish < notice.jobs[0].finish


def test_the_probers_answers_are_its_releases_post_processed() -> None:
    # the prober (tenant a) owns no gang job and holds nothing: every answer must be
    # exactly its share of the lower edge of the release it last received
    cfg = config(6, tenants=("a", "b", "c", "d"), sample_s=600.0)
    jobs = [job(i, 700.0 * i, 3000.0 + 500.0 * (i % 7), 8 if i % 3 else 16,
                "bcd"[i % 3] if i % 3 else "b") for i in range(60)]
    sim = simulation(cfg, jobs, regimes.negotiated(NegotiationPlan(probe=True)))
    result = sim.run()
    probes = result.records.probes
    assert len(probes) > 5
    feed = result.records.feed
    share = 0.25
    for t, _pool, offered in probes:
        last = [r for r in feed if r[0] <= t][-1]
        assert offered == allowance(last[6], share, 1.0), (t, last)
    # and what the prober sees adds a reading per answer, never a new host count
    seen = seen_by_prober(result.records, share)
    assert len(seen.feed) == len(feed) + len(probes)
    assert {r[2:6] for r in seen.feed} == {r[2:6] for r in feed}


def test_jain_and_the_figures() -> None:
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == 0.25
    result = simulation(config(4), GANG, regimes.full()).run()
    f = figures(result)
    assert f.gang_mean_wait_h == pytest.approx(7000 / 3600)
    assert f.median_wait_h == 0.0 and math.isclose(f.p99_wait_h, 7000 / 3600)
    assert 0 < f.jain <= 1


def test_conditions_and_bad_plans() -> None:
    assert cause_of("GPU Temperature High").value == "thermal"
    assert cause_of("GPU SBE(Single Bit ECC) > Threshold").value == "correctable-trend"
    assert cause_of("NIC Link Speed low").value == "link-degraded"
    with pytest.raises(ValueError, match="maintenance must be one of"):
        NegotiationPlan(maintenance="sometimes")
    with pytest.raises(ValueError, match="no_show_rate"):
        NegotiationPlan(no_show_rate=1.5)
