"""Differentially private pool capacity: the release plans, their accountant and noise.

What is protected, and how (docs/privacy-utility.md proves it; the operator guide says
what it means in practice):

* **The unit is one host over any 24 hours** (``unit = "job"``: any ``job_hosts`` hosts
  together). Two histories of a pool are neighbours when they differ only in what that
  host (those hosts) did within one window of 24 hours: up, down or drained, and how
  many of its GPUs were in use, at any times in it. Which hosts a pool has (its
  inventory) is the same in both. A host contributes at most ``host_gpus`` GPUs to a
  pool's count (more are clamped), so at any instant the unit moves the free-GPU count by
  at most ``host_gpus * group`` and each host count by at most ``group`` (1 for a host).
* **A pool is released R times a day, on a schedule that does not depend on the data.**
  Each release adds discrete Laplace noise (OpenDP's ``make_laplace`` on integers,
  sampled from the operating system's secure generator) with a scale that makes it
  ``epsilon_per_day / R``-DP by OpenDP's own privacy map. ``R`` (:func:`sized_plan`)
  is the most releases a day (at most one every ``release_interval``) that keep the
  GPU noise's scale within ``noise_share`` of the pool's GPUs, and at least one every
  ``max_release_interval``: a small pool gets fewer, more precise releases for the same
  day's ε. ``R`` follows the configuration and the inventory only, so when releases
  happen says nothing about what any host did. Every tenant sees the same release (one
  message on one topic).
* **The accountant is sequential composition of pure-DP releases over a sliding day.**
  :class:`Ledger` charges each release its ε and refuses one that would take the ε spent
  in the last 24 hours above ``epsilon_per_day``. The schedule
  (controller/releaseschedule.py) spaces releases so that it never has to, across a
  change of plan and across restarts. Ranges, clamping at zero, the trend and leaving
  out a repeated range are post-processing and cost nothing.

What it does not protect: the aggregate itself. Free GPUs are capacity minus everyone's
load; a feed that tells a tenant how much room a pool has tells it, within the noise,
how loaded the pool is. ε bounds what the feed reveals about any one host (or job of up
to ``job_hosts`` hosts), not about the pool as a whole.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

DAY = 86400.0

#: ``sampler(value, scale)``: ``value`` plus discrete Laplace noise of that scale.
Sampler = Callable[[int, float], int]


@dataclass(frozen=True)
class Plan:
    """A pool's release plan, derived from the redaction's configuration (and, with
    ``noise_share``, from how many hosts the pool has: :func:`sized_plan`)."""

    epsilon_per_day: float
    release_interval: float
    host_gpus: int
    gpu_share: float
    #: Hosts per protected unit: 1 for one host, ``job_hosts`` under ``unit = "job"``
    #: (group privacy: the unit's hosts may all change at once, so every sensitivity is
    #: this many times a host's).
    group: int = 1

    @property
    def releases_per_day(self) -> int:
        return max(1, math.floor(DAY / self.release_interval + 1e-9))

    @property
    def epsilon_per_release(self) -> float:
        return self.epsilon_per_day / self.releases_per_day

    @property
    def gpu_sensitivity(self) -> int:
        """The most one protected unit moves the free-GPU count by at one release."""
        return self.host_gpus * self.group

    @property
    def gpu_scale(self) -> float:
        """Noise scale (GPUs) on the free-GPU count."""
        return self.gpu_sensitivity / (self.gpu_share * self.epsilon_per_release)

    @property
    def host_scale(self) -> float | None:
        """Noise scale (hosts) on each host count; None: host counts are not released."""
        rest = (1.0 - self.gpu_share) * self.epsilon_per_release
        return None if rest <= 1e-12 else 2.0 * self.group / rest


def sized_plan(*, epsilon_per_day: float, fastest: float, slowest: float, host_gpus: int,
               gpu_share: float, noise_share: float, group: int, hosts: int) -> Plan:
    """A pool's plan: as many releases a day as keep the GPU noise's scale within
    ``noise_share`` of the pool's GPUs (``hosts * host_gpus``), at most one every
    ``fastest`` seconds and at least one every ``slowest``.

    A day's budget is the same whatever the number of releases: ``R`` releases a day
    each cost ``epsilon_per_day / R`` and carry noise of scale
    ``sensitivity * R / (gpu_share * epsilon_per_day)``. Noise of a fixed number of GPUs
    is negligible in a pool of 1,000 GPUs and drowns one of 32, so a small pool is
    released less often and more precisely. ``hosts`` is the pool's inventory (every
    host it has had, up or down), which the neighbouring relation leaves unchanged: the
    plan, and so when releases happen, says nothing about what any host did.
    ``noise_share`` 0: every pool at ``fastest`` (the plan before pools were sized).
    """
    most = max(1, math.floor(DAY / fastest + 1e-9))
    fewest = min(most, max(1, math.ceil(DAY / max(slowest, fastest) - 1e-9)))
    per_day = most
    if noise_share > 0 and hosts > 0:
        fits = math.floor(epsilon_per_day * gpu_share * noise_share * hosts / group + 1e-9)
        per_day = min(most, max(fewest, fits))
    return Plan(epsilon_per_day, DAY / per_day, host_gpus, gpu_share, group)


#: Each private count goes out as the range that holds the true count with this
#: probability, given the noise (post-processing of the noisy value: no ε).
CONFIDENCE = 0.9


def margin(scale: float, confidence: float = CONFIDENCE) -> int:
    """The smallest ``k`` with P(|noise| > k) <= 1 - confidence, for discrete Laplace.

    With ``a = exp(-1/scale)``, P(|X| >= k) = 2 a**k / (1 + a) for k >= 1.
    """
    a = math.exp(-1.0 / scale)
    k = math.log((1.0 - confidence) * (1.0 + a) / 2.0) / math.log(a) - 1.0
    return max(0, math.ceil(k - 1e-9))


@functools.lru_cache(maxsize=64)
def release_epsilon(plan: Plan) -> float:
    """ε of one release for one host's change, from OpenDP's privacy maps (composed)."""
    eps = _laplace(plan.gpu_scale).map(plan.gpu_sensitivity)
    if plan.host_scale is not None:
        eps += 2 * _laplace(plan.host_scale).map(plan.group)
    return float(eps)


_MEASUREMENTS: dict[float, object] = {}


def _laplace(scale: float):  # noqa: ANN202 - an OpenDP Measurement
    m = _MEASUREMENTS.get(scale)
    if m is None:
        import opendp.prelude as dp  # noqa: PLC0415 - its native library loads on first use

        dp.enable_features("contrib")
        m = _MEASUREMENTS[scale] = dp.m.make_laplace(
            dp.atom_domain(T=int), dp.absolute_distance(T=int), scale=scale)
    return m


def opendp_sampler(value: int, scale: float) -> int:
    """The product's noise: OpenDP's discrete Laplace, from the OS's secure generator."""
    return int(_laplace(scale)(int(value)))  # type: ignore[operator]


def seeded_sampler(seed: str) -> Sampler:
    """The same distribution from a seeded generator, for the simulator and tests only.

    OpenDP does not take a seed (on purpose), and a simulated run must come out the same
    from its seed. A discrete Laplace variable with parameter ``exp(-1/scale)`` is the
    difference of two independent geometric ones with success probability
    ``1 - exp(-1/scale)``; numpy draws those. ``tests/sim/test_privacy.py`` checks that
    both samplers agree in distribution.
    """
    import numpy as np  # noqa: PLC0415 - the simulator's dependency, not the controller's

    digest = hashlib.sha256(seed.encode()).digest()
    rng = np.random.Generator(np.random.PCG64(int.from_bytes(digest[:16], "big")))

    def sample(value: int, scale: float) -> int:
        p = -math.expm1(-1.0 / scale)
        return int(value) + int(rng.geometric(p)) - int(rng.geometric(p))

    return sample


@dataclass
class Ledger:
    """ε spent per pool topic over a sliding day; refuses what would exceed the budget."""

    _charges: dict[str, deque[tuple[float, float]]] = field(default_factory=dict)
    #: Releases refused because the day's budget was spent (stays 0 under the plan).
    refused: int = 0
    #: The most ε any topic had spent over 24 hours, at any time (the accountant's own
    #: record of the bound it kept; the simulator reports it).
    peak: float = 0.0

    def spent(self, topic: str, now: float) -> float:
        charges = self._charges.get(topic)
        if not charges:
            return 0.0
        while charges and charges[0][0] <= now - DAY:
            charges.popleft()
        return sum(eps for _, eps in charges)

    def releases(self, topic: str, now: float) -> int:
        self.spent(topic, now)
        return len(self._charges.get(topic, ()))

    def charge(self, topic: str, now: float, eps: float, budget: float) -> bool:
        if self.spent(topic, now) + eps > budget * (1 + 1e-9):
            self.refused += 1
            return False
        self._charges.setdefault(topic, deque()).append((now, eps))
        self.peak = max(self.peak, self.spent(topic, now))
        return True

    def topics(self) -> list[str]:
        return sorted(self._charges)

    def history(self, topic: str) -> list[tuple[float, float]]:
        """Every (time, ε) still in the window (for tests and ``harmonctl -C privacy``)."""
        return list(self._charges.get(topic, ()))
