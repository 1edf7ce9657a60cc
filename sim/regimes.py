"""Information regimes: no feed, the product's feed (private), the coarse feed, everything.

Each regime is just a :class:`RedactionConfig` for the controller's redactor; the
simulator adds no rules of its own. ``redacted`` is the product's default feed (private
mode, controller.privacy: each pool released as often as its size allows for noise
within ``noise_share`` of its GPUs); :func:`uniform` is the private feed before pools
were sized (every pool every ``release_interval``, the same noise in GPUs everywhere);
:func:`frontier` varies ε per day, the release interval, ``noise_share`` and the unit.
``coarse`` is the feed before it (buckets, k, delay), and its sweep varies one knob of
that at a time:

* ``bucket``: every bucket edge, host and GPU, multiplied by ``s`` (``s`` = 1 is the
  default). Relative resolution stays a factor of two, but the smallest count told apart
  grows with ``s``.
* ``host``: only the host-count edges multiplied by ``s``. At ``s`` = 1/2 they begin
  0, 1, 2, 4, the defaults before they were doubled, so "no host down" and "one host
  down" are told apart (the default's first host bucket is 0-1).
* ``k``: ``min_hosts``, the fewest hosts an aggregate may cover.
* ``interval``: ``min_interval``, seconds between two updates of one pool (jitter stays).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from controller.redactionconfig import Mode, RedactionConfig, Unit
from sim.negotiation import NegotiationPlan

if TYPE_CHECKING:
    from sim.energy import Plan

_DEFAULT = RedactionConfig()

#: The coarse feed's k (its default before private mode published every pool).
COARSE_MIN_HOSTS = 5
BUCKET_SCALES = (1, 2, 4, 8, 16)
#: 0.5 is the previous default (host edges 0, 1, 2, 4, ...; the GPU edges unchanged).
HOST_SCALES = (0.5, 1, 2, 4)
MIN_HOSTS = (1, 5, 10, 20, 40)
MIN_INTERVALS = (0.0, 10.0, 60.0, 600.0, 3600.0)


@dataclass(frozen=True)
class Regime:
    name: str
    redaction: RedactionConfig
    #: Which knob this sweep point varies ("" for the three main regimes) and its value.
    knob: str = ""
    value: float = 0.0
    #: Tenants declare slack for energy (sim/energy.py); None: nobody does.
    energy: Plan | None = None
    #: Tenants negotiate reservations and maintenance (sim/negotiation.py); None: not.
    negotiation: NegotiationPlan | None = None


def scaled(edges: tuple[int, ...], s: float) -> tuple[int, ...]:
    """Every edge times ``s`` (a fraction must keep them whole and apart)."""
    out = tuple(e * s for e in edges)
    if any(e != int(e) for e in out) or len(set(out)) != len(out):
        raise ValueError(f"edges {edges} cannot be scaled by {s}")
    return tuple(int(e) for e in out)


def none() -> Regime:
    return Regime("none", RedactionConfig(mode=Mode.NONE))


def full() -> Regime:
    return Regime("full", RedactionConfig(mode=Mode.FULL))


def redacted(epsilon_per_day: float | None = None, release_interval: float | None = None, *,
             gpu_share: float | None = None, noise_share: float | None = None,
             unit: Unit | None = None, job_hosts: int | None = None,
             stale_after: float | None = None, knob: str = "",
             value: float = 0.0, name: str = "redacted") -> Regime:
    """The product's feed: private mode, by default exactly the controller's defaults."""
    d = _DEFAULT
    cfg = RedactionConfig(
        mode=Mode.PRIVATE,
        epsilon_per_day=d.epsilon_per_day if epsilon_per_day is None else epsilon_per_day,
        release_interval=d.release_interval if release_interval is None else release_interval,
        gpu_share=d.gpu_share if gpu_share is None else gpu_share,
        noise_share=d.noise_share if noise_share is None else noise_share,
        unit=d.unit if unit is None else unit,
        job_hosts=d.job_hosts if job_hosts is None else job_hosts,
        stale_after=d.stale_after if stale_after is None else stale_after)
    return Regime(name, cfg, knob, value)


def uniform(epsilon_per_day: float | None = None, *, knob: str = "", value: float = 0.0,
            name: str = "uniform") -> Regime:
    """The private feed before pools were sized: every pool every ``release_interval``
    (900 s), so noise of the same number of GPUs (64 at ε 12) in a pool of any size."""
    return redacted(epsilon_per_day, noise_share=0.0, knob=knob, value=value, name=name)


def job_unit(job_hosts: int, epsilon_per_day: float | None = None) -> Regime:
    """The default feed with ε protecting any ``job_hosts`` hosts together (a job's)."""
    return redacted(epsilon_per_day, unit=Unit.JOB, job_hosts=job_hosts, knob="job_hosts",
                    value=job_hosts, name=f"job unit, {job_hosts} hosts")


def coarse(bucket_scale: int = 1, *, host_scale: float = 1, min_hosts: int | None = None,
           min_interval: float | None = None, knob: str = "", value: float = 0.0,
           name: str = "coarse") -> Regime:
    """The feed before private mode: buckets, k hosts at least, delay and jitter."""
    cfg = RedactionConfig(
        mode=Mode.REDACTED,
        min_hosts=COARSE_MIN_HOSTS if min_hosts is None else min_hosts,
        host_buckets=scaled(_DEFAULT.host_buckets, bucket_scale * host_scale),
        gpu_buckets=scaled(_DEFAULT.gpu_buckets, bucket_scale),
        min_interval=_DEFAULT.min_interval if min_interval is None else min_interval,
    )
    return Regime(name, cfg, knob, value)


def main_regimes() -> list[Regime]:
    return [none(), redacted(), full()]


def coarse_sweep() -> list[Regime]:
    """The coarse feed and each one-knob variation of it (its default included once)."""
    points = [coarse(knob="default", value=0.0)]
    points += [coarse(bucket_scale=s, knob="bucket", value=s, name=f"bucket x{s}")
               for s in BUCKET_SCALES if s != 1]
    points += [coarse(host_scale=s, knob="host", value=s, name=f"host x{s:g}")
               for s in HOST_SCALES if s != 1]
    points += [coarse(min_hosts=k, knob="k", value=k, name=f"k={k}")
               for k in MIN_HOSTS if k != COARSE_MIN_HOSTS]
    points += [coarse(min_interval=i, knob="interval", value=i, name=f"interval {i:g}s")
               for i in MIN_INTERVALS if i != _DEFAULT.min_interval]
    return points


#: The private frontier: ε per pool per day (ε ≤ 3 among them) at the default plan
#: (pools sized, 900 s at most), then the shortest interval at the default ε, the plan
#: before pools were sized at two ε for comparison, and the job unit at the default ε.
EPSILONS = (1.0, 2.0, 3.0, 6.0, 12.0, 24.0, 48.0)
EPSILON_SWEEP_INTERVAL = _DEFAULT.release_interval
INTERVALS = (1800.0, 3600.0)
UNIFORM_EPSILONS = (3.0, 12.0)
JOB_HOSTS = (8,)
#: ``noise_share`` at the default ε: how precise (and so how rare) a small pool's releases.
NOISE_SHARES = (0.025, 0.1, 0.25)


def frontier() -> list[Regime]:
    """Private mode over ε per day, the shortest interval, the plan and the unit."""
    points = [redacted(epsilon_per_day=e, knob="epsilon", value=e, name=f"eps {e:g}/day")
              for e in EPSILONS]
    points += [redacted(release_interval=i, knob="interval", value=i,
                        name=f"every {i:g}s or less often")
               for i in INTERVALS if i != EPSILON_SWEEP_INTERVAL]
    points += [uniform(e, knob="uniform", value=e, name=f"uniform eps {e:g}/day")
               for e in UNIFORM_EPSILONS]
    points += [redacted(noise_share=n, knob="noise_share", value=n,
                        name=f"noise share {n:g}")
               for n in NOISE_SHARES if n != _DEFAULT.noise_share]
    points += [job_unit(k) for k in JOB_HOSTS]
    return points


def knob_default(knob: str) -> float:
    return {"bucket": 1.0, "host": 1.0, "k": float(COARSE_MIN_HOSTS),
            "interval": _DEFAULT.min_interval}[knob]


def negotiated(plan: NegotiationPlan, name: str = "negotiated",
               redaction: RedactionConfig | None = None) -> Regime:
    """The product's private feed (or ``redaction``), and tenants negotiating through the
    controller's engine on top of it (sim/negotiation.py)."""
    return Regime(name, redacted().redaction if redaction is None else redaction,
                  negotiation=plan)
