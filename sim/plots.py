"""The privacy-utility figures (matplotlib, Agg backend, small PNGs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sim.metrics import benefit_share
from sim.regimes import knob_default
from sim.scenario import Outcome

KNOBS = (("bucket", "all bucket edges x s"), ("host", "host-count edges x s"),
         ("k", "k = min_hosts"), ("interval", "min_interval (s)"))
DPI = 90


def _series(points: Sequence[Outcome], knob: str) -> list[Outcome]:
    """The sweep points varying ``knob``, with the default in its place, by value."""
    chosen = [o for o in points if o.regime.knob == knob]
    default = [o for o in points if o.regime.knob == "default"]
    chosen += [replace(o, regime=replace(o.regime, knob=knob, value=knob_default(knob)))
               for o in default]
    return sorted(chosen, key=lambda o: o.regime.value)


def _xscale(ax: plt.Axes, knob: str) -> None:
    if knob == "interval":
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(left=0)
    else:
        ax.set_xscale("log", base=2)


def outcome_vs_coarseness(points: Sequence[Outcome], none: Outcome, full: Outcome,
                          path: Path) -> None:
    fig, axes = plt.subplots(1, len(KNOBS), figsize=(12, 3.1), sharey=True)
    for ax, (knob, label) in zip(axes, KNOBS, strict=True):
        series = _series(points, knob)
        xs = [o.regime.value for o in series]
        ax.plot(xs, [o.summary.mean_jct_h for o in series], "o-", color="tab:blue",
                label="redacted")
        ax.axhline(none.summary.mean_jct_h, color="tab:red", ls="--", label="no feed")
        ax.axhline(full.summary.mean_jct_h, color="tab:green", ls="--", label="full")
        _xscale(ax, knob)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("mean JCT (h)")
    axes[0].legend(fontsize=8)
    fig.suptitle("Tenant outcome vs redaction coarseness (lower is better)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def attack_vs_coarseness(points: Sequence[Outcome], none: Outcome, full: Outcome,
                         path: Path) -> None:
    fig, axes = plt.subplots(1, len(KNOBS), figsize=(12, 3.1), sharey=True)
    for ax, (knob, label) in zip(axes, KNOBS, strict=True):
        series = _series(points, knob)
        xs = [o.regime.value for o in series]
        ax.plot(xs, [o.load_attack.accuracy or 0.5 for o in series], "o-",
                color="tab:purple", label="others' load")
        ax.plot(xs, [o.failure_attack.accuracy or 0.5 for o in series], "s-",
                color="tab:orange", label="a host failed")
        ax.axhline(0.5, color="grey", ls=":", label="chance (= no feed)")
        ax.axhline(full.load_attack.accuracy or 0.5, color="tab:purple", ls="--", alpha=0.5,
                   label="full: load")
        _xscale(ax, knob)
        ax.set_xlabel(label)
        ax.set_ylim(0.45, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("attacker balanced accuracy")
    axes[0].legend(fontsize=7)
    fig.suptitle("What an attacking tenant infers vs redaction coarseness", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def frontier(points: Sequence[Outcome], none: Outcome, full: Outcome, path: Path) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    n, f = none.summary.mean_jct_h, full.summary.mean_jct_h

    def share(o: Outcome) -> float:
        return benefit_share(n, o.summary.mean_jct_h, f) or 0.0

    attacks = (("load_attack", "others' load"), ("failure_attack", "a host failed"))
    markers = {"default": "*", "bucket": "o", "host": "D", "k": "s", "interval": "^"}
    for ax, (attr, what) in zip(axes, attacks, strict=True):
        def acc(o: Outcome, attr: str = attr) -> float:
            return getattr(o, attr).accuracy or 0.5

        for knob, marker in markers.items():
            pts = [o for o in points if o.regime.knob == knob]
            if not pts:
                continue
            ax.scatter([acc(o) for o in pts], [share(o) for o in pts], marker=marker,
                       s=140 if knob == "default" else 40,
                       label="default redacted" if knob == "default" else f"vary {knob}")
            if knob != "default":
                for o in pts:
                    ax.annotate(f"{o.regime.value:g}", (acc(o), share(o)), fontsize=7,
                                xytext=(3, 3), textcoords="offset points")
        ax.scatter([acc(none)], [0.0], color="tab:red", marker="X", s=80, label="no feed")
        ax.scatter([acc(full)], [1.0], color="tab:green", marker="X", s=80,
                   label="full visibility")
        ax.set_xlabel(f"attacker accuracy, {what} (balanced; 0.5 = chance)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of full visibility's mean-JCT benefit")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("Privacy-utility frontier: up and to the left is better", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def write_all(out: Path, points: Sequence[Outcome], none: Outcome, full: Outcome) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "sim-outcome-vs-coarseness.png", out / "sim-attack-vs-coarseness.png",
             out / "sim-privacy-utility-frontier.png"]
    outcome_vs_coarseness(points, none, full, paths[0])
    attack_vs_coarseness(points, none, full, paths[1])
    frontier(points, none, full, paths[2])
    return paths


def frontier_figures(out: Path, rows: Sequence[dict]) -> list[Path]:
    """The private feed's frontier from the privacy-utility benchmark's rows: benefit kept
    and both attacks (with 95% intervals) against ε per pool per day, and the trade-off."""
    out.mkdir(parents=True, exist_ok=True)
    eps = sorted((r for r in rows if r["regime"].startswith("eps ")),
                 key=lambda r: r["epsilon_day_max"])
    others = [r for r in rows if not r["regime"].startswith("eps ")]
    xs = [float(r["regime"].split()[1].split("/")[0]) for r in eps]
    paths = [out / "privacy-frontier-epsilon.png", out / "privacy-frontier-tradeoff.png"]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ax = axes[0]
    ax.plot(xs, [100 * (r["benefit_median"] or 0) for r in eps], "o-", label="median")
    ax.plot(xs, [100 * (r["benefit_worst"] or 0) for r in eps], "s--", label="worst scenario")
    ax.axhline(90, color="tab:green", ls=":", alpha=0.6, label="target: median 90%")
    ax.axhline(75, color="tab:orange", ls=":", alpha=0.6, label="target: worst 75%")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ε per pool per day (hourly releases)")
    ax.set_ylabel("% of full visibility's mean-JCT benefit")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax = axes[1]
    for key, label, marker in (("load", "others' load", "o"), ("failure", "a host failed", "s")):
        acc = [r[key]["accuracy"] for r in eps]
        # A percentile interval of a few days need not hold the point estimate.
        lo = [max(0.0, r[key]["accuracy"] - r[key]["low"]) for r in eps]
        hi = [max(0.0, r[key]["high"] - r[key]["accuracy"]) for r in eps]
        ax.errorbar(xs, acc, yerr=[lo, hi], fmt=marker + "-", capsize=3, label=label)
    ax.axhline(0.55, color="tab:red", ls=":", alpha=0.6, label="target: upper bound 0.55")
    ax.axhline(0.5, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ε per pool per day (hourly releases)")
    ax.set_ylabel("attacker balanced accuracy (95% interval)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(paths[0], dpi=DPI)
    plt.close(fig)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, key, what in ((axes[0], "load", "others' load"), (axes[1], "failure",
                                                               "a host failed")):
        ax.plot([r[key]["high"] for r in eps], [100 * (r["benefit_median"] or 0) for r in eps],
                "o-", label="private, hourly, by ε/day")
        for r, x in zip(eps, xs, strict=True):
            ax.annotate(f"{x:g}", (r[key]["high"], 100 * (r["benefit_median"] or 0)),
                        fontsize=7, xytext=(3, 3), textcoords="offset points")
        for r in others:
            ax.scatter([r[key]["high"]], [100 * (r["benefit_median"] or 0)], marker="X",
                       s=60, label=r["regime"] + (" (default)" if r.get("default") else ""))
        ax.axvline(0.55, color="tab:red", ls=":", alpha=0.6)
        ax.axhline(90, color="tab:green", ls=":", alpha=0.6)
        ax.set_xlabel(f"upper 95% bound of the attack, {what}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("median % of full visibility's benefit")
    axes[1].legend(fontsize=7, loc="lower right")
    fig.suptitle("The frontier: targets are up and left of the dotted lines", fontsize=10)
    fig.tight_layout()
    fig.savefig(paths[1], dpi=DPI)
    plt.close(fig)
    return paths
