"""Tables and headline numbers from a set of regime outcomes."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from harmonaize.tables import table
from sim.evaluation import MARGIN_H, MARGIN_REL, kept_share
from sim.learned import LearnedScore
from sim.metrics import benefit_share
from sim.scenario import Outcome, Scenario

#: What a share reads where the pre-registered margin is not met (sim.evaluation).
UNDEFINED = "- (full within margin)"


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{round(100 * value):d}%"


def _jct_share(none_h: float, regime_h: float, full_h: float) -> str:
    """The mean-JCT share kept, only where full visibility beats no feed by the margin."""
    share = kept_share(none_h, regime_h, full_h)
    return UNDEFINED if share is None else _pct(share)


def _acc(score: LearnedScore) -> str:
    return "collapsed" if score.is_collapsed else _f(score.accuracy)


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
            "load": _acc(o.load_attack), "fail": _acc(o.failure_attack),
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
             "((redacted - none) / (full - none)); the mean JCT's only where full visibility "
             f"beats no feed by >= {MARGIN_H:g} h and >= {100 * MARGIN_REL:g}%:"]
    for name, share in shares(none, red, full).items():
        if name == "mean JCT":
            text = _jct_share(none.summary.mean_jct_h, red.summary.mean_jct_h,
                              full.summary.mean_jct_h)
        else:
            text = _pct(share)
        lines.append(f"  {name:<22} {text}")
    lines.append("Attacker balanced accuracy (chance: the no-feed row): others' load / a host "
                 "failed")
    for o in (none, red, full):
        lines.append(f"  {o.regime.name:<22} {_acc(o.load_attack)} / "
                     f"{_acc(o.failure_attack)}  "
                     f"({o.failure_attack.positives} failure windows in the test half)")
    return "\n".join(lines)


def sweep_table(points: Sequence[Outcome], none: Outcome, full: Outcome) -> str:
    rows = []
    for o in points:
        m = o.summary
        rows.append({
            "knob": o.regime.knob, "value": f"{o.regime.value:g}", "jct": _f(m.mean_jct_h),
            "share": _jct_share(none.summary.mean_jct_h, m.mean_jct_h, full.summary.mean_jct_h),
            "goodput": _f(m.goodput, 3),
            "load": _acc(o.load_attack), "fail": _acc(o.failure_attack),
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
            "share": _jct_share(none.summary.mean_jct_h, red.summary.mean_jct_h,
                                full.summary.mean_jct_h),
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
        share = kept_share(none.summary.mean_jct_h, red.summary.mean_jct_h,
                           full.summary.mean_jct_h)
        if share is not None:
            kept.append(share)
        rows.append({
            "seed": str(seed), "none": _f(none.summary.mean_jct_h),
            "red": _f(red.summary.mean_jct_h), "full": _f(full.summary.mean_jct_h),
            "share": UNDEFINED if share is None else _pct(share),
            "lred": _acc(red.load_attack), "lfull": _acc(full.load_attack),
            "fred": _acc(red.failure_attack), "ffull": _acc(full.failure_attack),
        })
    text = table(rows, [
        ("seed", "seed"), ("none", "JCT none"), ("red", "JCT redacted"), ("full", "JCT full"),
        ("share", "kept"), ("lred", "load attack redacted"), ("lfull", "full"),
        ("fred", "failure attack redacted"), ("ffull", "full"),
    ])
    if kept:
        kept.sort()
        text += (f"\nshare kept over the {len(kept)} of {len(rows)} seeds where it is defined: "
                 f"median {_pct(statistics.median(kept))}, range {_pct(kept[0])} to "
                 f"{_pct(kept[-1])}")
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
            "pool": pool.name, "hosts": str(pool.nodes),
            "gpus": str(pool.nodes * scenario.cluster.gpus_per_node), "jobs": str(jobs),
            "covered": "yes" if pool.nodes >= min_hosts else "no (k)",
            "none": _f(jct["none"]), "red": _f(jct["redacted"]), "full": _f(jct["full"]),
            "share": _jct_share(jct["none"], jct["redacted"], jct["full"]),
        })
    return table(rows, [
        ("pool", "pool"), ("hosts", "hosts"), ("gpus", "GPUs"), ("jobs", "jobs"),
        ("covered", "redacted feed publishes it"), ("none", "JCT none"),
        ("red", "JCT redacted"), ("full", "JCT full"), ("share", "kept"),
    ])


def frontier_rows(points: Sequence[Outcome], none: Outcome, full: Outcome) -> list[dict]:
    """One scenario's sweep points in the shape sim.plots.frontier_figures draws."""
    rows = []
    for o in points:
        share = kept_share(none.summary.mean_jct_h, o.summary.mean_jct_h,
                           full.summary.mean_jct_h)
        rows.append({"regime": o.regime.name, "benefit_median": share,
                     "benefit_worst": share, "epsilon_day_max": o.epsilon_day_max,
                     "load": vars(o.load_attack), "failure": vars(o.failure_attack)})
    return rows
