"""Each pool's counts kept as hosts change, for the redactor (controller/redaction.py).

What tenants are told about pools is a function of a few sums per pool (hosts, hosts
available, their free GPUs, those clamped to the sensitivity the noise is scaled for)
and of which reported names are undeclared. Counting them from every host whenever
one changed cost a pass over the whole region per batch; here each host's part is kept,
and a changed host moves its pool's sums by its new part less its old one. The sums are
integers, so the running totals are exactly what a count from scratch gives
(tests/controller/test_incremental_counts.py drives both with the same changes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from controller.redactionconfig import PoolNames
from controller.types import HostState

#: (pool, class) under the declared names.
Key = tuple[str, str]


@dataclass(frozen=True)
class Part:
    """What one host adds to the counts: its pool under the declared names (None: left
    out, under the names its agent reported), whether it is available, its free GPUs
    (0 when not available) and those clamped."""

    key: Key | None
    reported: Key
    up: int
    gpus: int
    clamped: int


@dataclass
class Sums:
    """One pool's counts: hosts, hosts available, their free GPUs, clamped and not."""

    hosts: int = 0
    up: int = 0
    gpus: int = 0
    clamped: int = 0

    def add(self, part: Part, sign: int) -> None:
        self.hosts += sign
        self.up += sign * part.up
        self.gpus += sign * part.gpus
        self.clamped += sign * part.clamped


@dataclass
class PoolTally:
    """The latest view of every host seen and the sums per pool they make."""

    #: Every host's latest view, by id (what a job's health is judged from).
    views: dict[str, HostState] = field(default_factory=dict)
    #: The pools with at least one host (in no particular order).
    pools: dict[Key, Sums] = field(default_factory=dict)
    #: Hosts left out, by the (pool, class) their agents reported.
    held_back: Counter[Key] = field(default_factory=Counter)
    _parts: dict[str, Part] = field(default_factory=dict)
    #: The rules the parts were made under: other rules, other parts.
    _rules: tuple[PoolNames | None, int] | None = None

    def rebuild(self, hosts: Iterable[HostState], names: PoolNames | None, cap: int) -> None:
        """Exactly these hosts, counted from scratch."""
        self.views, self.pools, self.held_back, self._parts = {}, {}, Counter(), {}
        self._rules = (names, cap)
        self.update(hosts, names, cap)

    def update(self, changed: Iterable[HostState], names: PoolNames | None, cap: int) -> None:
        """Hosts whose view may have changed (new ones too): each one's old part out of
        the sums, its new one in."""
        if self._rules != (names, cap):
            # Names declared or the clamp changed: every host's part may differ.
            self.rebuild([*self.views.values()], names, cap)
        for view in changed:
            old = self._parts.get(view.host_id)
            new = self._part(view, names, cap)
            self.views[view.host_id] = view
            if old == new:
                continue
            if old is not None:
                self._count(old, -1)
            self._parts[view.host_id] = new
            self._count(new, 1)

    @staticmethod
    def _part(view: HostState, names: PoolNames | None, cap: int) -> Part:
        reported = (view.pool, view.gpu_class)
        key = reported if names is None else names.own(view.pool, view.gpu_class)
        if not view.available:
            return Part(key, reported, 0, 0, 0)
        free = view.gpus.available
        return Part(key, reported, 1, free, min(free, cap))

    def _count(self, part: Part, sign: int) -> None:
        if part.key is None:
            self.held_back[part.reported] += sign
            if self.held_back[part.reported] <= 0:
                del self.held_back[part.reported]  # as a count from scratch has it
            return
        sums = self.pools.get(part.key)
        if sums is None:
            sums = self.pools[part.key] = Sums()
        sums.add(part, sign)
        if sums.hosts <= 0:
            del self.pools[part.key]  # no host left: no pool, as from scratch


def counted(hosts: Iterable[HostState], cap: int,
            names: PoolNames | None = None) -> dict[Key, Sums]:
    """The sums per pool of exactly these hosts (GPUs clamped to ``cap``)."""
    tally = PoolTally()
    tally.rebuild(hosts, names, cap)
    return tally.pools
