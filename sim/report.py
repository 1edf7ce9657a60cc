"""Tables and headline numbers from a set of regime outcomes."""

from __future__ import annotations

from collections.abc import Sequence

from harmonaize.tables import table
from sim.metrics import benefit_share
from sim.scenario import Outcome, Scenario


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{round(100 * value):d}%"


def scenario_line(s: Scenario) -> str:
    pools = s.cluster.pools
    soft = sum(1 for f in s.faults if f.soft)
    warned = sum(1 for f in s.faults if f.lead is not None)
    return (f"{len(s.jobs)} jobs, {len(pools)} pools, {s.cluster.node_count} nodes "
            f"({s.cluster.node_count * s.cluster.gpus_per_node} GPUs), "
            f"{len(s.faults)} faults on the timeline ({soft} degrading, {warned} with a "
            f"precursor), {len(s.congestion)} congestion episodes, seed {s.cfg.seed}")


def regime_table(outcomes: Sequence[Outcome]) -> str:
    rows = []
    for o in outcomes:
        m = o.summary
        rows.append({
            "regime": o.regime.name,
            "jct": _f(m.mean_jct_h), "p99": _f(m.p99_jct_h, 1), "queue": _f(m.mean_queue_h),
            "goodput": _f(m.goodput, 3), "util": _f(m.utilization, 3),
            "fault": _f(m.fault_lost_gpu_h, 0), "preempt": _f(m.preempt_lost_gpu_h, 0),
            "done": f"{m.finished}/{m.jobs}",
            "load": _f(o.load_attack.accuracy), "fail": _f(o.failure_attack.accuracy),
        })
    return table(rows, [
        ("regime", "regime"), ("jct", "mean JCT h"), ("p99", "p99 JCT h"),
        ("queue", "mean queue h"), ("goodput", "goodput"), ("util", "util"),
        ("fault", "fault GPU-h lost"), ("preempt", "reclaim GPU-h lost"), ("done", "finished"),
        ("load", "attack: load"), ("fail", "attack: failure"),
    ])


def by_name(outcomes: Sequence[Outcome]) -> dict[str, Outcome]:
    return {o.regime.name: o for o in outcomes}


def shares(none: Outcome, redacted: Outcome, full: Outcome) -> dict[str, float | None]:
    """Share of full visibility's benefit the redacted feed keeps, per outcome."""
    n, r, f = none.summary, redacted.summary, full.summary
    return {
        "mean JCT": benefit_share(n.mean_jct_h, r.mean_jct_h, f.mean_jct_h),
        "p99 JCT": benefit_share(n.p99_jct_h, r.p99_jct_h, f.p99_jct_h),
        "mean queueing delay": benefit_share(n.mean_queue_h, r.mean_queue_h, f.mean_queue_h),
        "goodput": benefit_share(n.goodput, r.goodput, f.goodput),
        "GPU-h lost to faults": benefit_share(n.fault_lost_gpu_h, r.fault_lost_gpu_h,
                                              f.fault_lost_gpu_h),
    }


def headline(outcomes: Sequence[Outcome]) -> str:
    named = by_name(outcomes)
    none, red, full = named["none"], named["redacted"], named["full"]
    lines = ["Share of full visibility's benefit kept by the default redacted feed "
             "((redacted - none) / (full - none)):"]
    for name, share in shares(none, red, full).items():
        lines.append(f"  {name:<22} {_pct(share)}")
    lines.append("Attacker balanced accuracy (chance 0.50): others' load / a host failed")
    for o in (none, red, full):
        lines.append(f"  {o.regime.name:<22} {_f(o.load_attack.accuracy)} / "
                     f"{_f(o.failure_attack.accuracy)}  "
                     f"({o.failure_attack.positives} failure windows in the test half)")
    return "\n".join(lines)


def sweep_table(points: Sequence[Outcome], none: Outcome, full: Outcome) -> str:
    rows = []
    for o in points:
        m = o.summary
        rows.append({
            "knob": o.regime.knob, "value": f"{o.regime.value:g}", "jct": _f(m.mean_jct_h),
            "share": _pct(benefit_share(none.summary.mean_jct_h, m.mean_jct_h,
                                        full.summary.mean_jct_h)),
            "goodput": _f(m.goodput, 3),
            "load": _f(o.load_attack.accuracy), "fail": _f(o.failure_attack.accuracy),
            "pubs": str(o.counters.get("publications_pool", 0)),
        })
    return table(rows, [
        ("knob", "knob"), ("value", "value"), ("jct", "mean JCT h"),
        ("share", "JCT benefit kept"), ("goodput", "goodput"), ("load", "attack: load"),
        ("fail", "attack: failure"), ("pubs", "pool updates"),
    ])


def ablation_table(rows: Sequence[tuple[str, Outcome, Outcome, Outcome]]) -> str:
    """Rows: (opportunity, none, redacted, full), each run with only that opportunity on."""
    out = []
    for name, none, red, full in rows:
        out.append({
            "opp": name,
            "none": _f(none.summary.mean_jct_h), "red": _f(red.summary.mean_jct_h),
            "full": _f(full.summary.mean_jct_h),
            "share": _pct(benefit_share(none.summary.mean_jct_h, red.summary.mean_jct_h,
                                        full.summary.mean_jct_h)),
            "gnone": _f(none.summary.goodput, 4), "gred": _f(red.summary.goodput, 4),
            "gfull": _f(full.summary.goodput, 4),
            "fnone": _f(none.summary.fault_lost_gpu_h, 0),
            "fred": _f(red.summary.fault_lost_gpu_h, 0),
            "ffull": _f(full.summary.fault_lost_gpu_h, 0),
        })
    return table(out, [
        ("opp", "only this decision"), ("none", "JCT none"), ("red", "JCT redacted"),
        ("full", "JCT full"), ("share", "kept"), ("gnone", "goodput none"),
        ("gred", "redacted"), ("gfull", "full"), ("fnone", "fault GPU-h none"),
        ("fred", "redacted"), ("ffull", "full"),
    ])


def seeds_table(runs: Sequence[tuple[int, Sequence[Outcome]]]) -> str:
    """One row per seed: the main regimes' mean JCT, the share kept, the attacks."""
    rows, kept = [], []
    for seed, outcomes in runs:
        named = by_name(outcomes)
        none, red, full = named["none"], named["redacted"], named["full"]
        share = benefit_share(none.summary.mean_jct_h, red.summary.mean_jct_h,
                              full.summary.mean_jct_h)
        if share is not None:
            kept.append(share)
        rows.append({
            "seed": str(seed), "none": _f(none.summary.mean_jct_h),
            "red": _f(red.summary.mean_jct_h), "full": _f(full.summary.mean_jct_h),
            "share": _pct(share),
            "lred": _f(red.load_attack.accuracy), "lfull": _f(full.load_attack.accuracy),
            "fred": _f(red.failure_attack.accuracy), "ffull": _f(full.failure_attack.accuracy),
        })
    text = table(rows, [
        ("seed", "seed"), ("none", "JCT none"), ("red", "JCT redacted"), ("full", "JCT full"),
        ("share", "kept"), ("lred", "load attack redacted"), ("lfull", "full"),
        ("fred", "failure attack redacted"), ("ffull", "full"),
    ])
    if kept:
        kept.sort()
        text += (f"\nshare kept over {len(kept)} seeds: median {_pct(kept[len(kept) // 2])}, "
                 f"range {_pct(kept[0])} to {_pct(kept[-1])}")
    return text


def pool_table(outcomes: Sequence[Outcome], scenario: Scenario, min_hosts: int,
               min_jobs: int = 100) -> str:
    """Mean JCT per pool and regime, with whether the redacted feed covers the pool."""
    named = by_name(outcomes)
    rows = []
    for pool in sorted(scenario.cluster.pools, key=lambda p: -named["none"].per_pool.get(
            p.name, (0, 0.0))[0]):
        jobs = named["none"].per_pool.get(pool.name, (0, 0.0))[0]
        if jobs < min_jobs:
            continue
        jct = {name: named[name].per_pool.get(pool.name, (0, 0.0))[1]
               for name in ("none", "redacted", "full")}
        rows.append({
            "pool": pool.name, "hosts": str(pool.nodes), "jobs": str(jobs),
            "covered": "yes" if pool.nodes >= min_hosts else "no (k)",
            "none": _f(jct["none"]), "red": _f(jct["redacted"]), "full": _f(jct["full"]),
            "share": _pct(benefit_share(jct["none"], jct["redacted"], jct["full"])),
        })
    return table(rows, [
        ("pool", "pool"), ("hosts", "hosts"), ("jobs", "jobs"),
        ("covered", "redacted feed publishes it"), ("none", "JCT none"),
        ("red", "JCT redacted"), ("full", "JCT full"), ("share", "kept"),
    ])


def frontier_rows(points: Sequence[Outcome], none: Outcome, full: Outcome) -> list[dict]:
    """One scenario's sweep points in the shape sim.plots.frontier_figures draws."""
    rows = []
    for o in points:
        share = benefit_share(none.summary.mean_jct_h, o.summary.mean_jct_h,
                              full.summary.mean_jct_h)
        rows.append({"regime": o.regime.name, "benefit_median": share,
                     "benefit_worst": share, "epsilon_day_max": o.epsilon_day_max,
                     "load": vars(o.load_attack), "failure": vars(o.failure_attack)})
    return rows
