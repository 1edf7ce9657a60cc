"""When each pool's private release is due, and under which plan (no I/O, no clock).

A pool's plan (controller/privacy.py: :func:`~controller.privacy.sized_plan`) follows
the configuration and the pool's inventory: every host it has had, up or down. Hosts
are never forgotten and a restart restores them (:meth:`Schedules.restore`), so the
inventory moves only when a host is added to the pool, or the operator reloads the
configuration. The schedule keeps the spacing the guarantee's proof uses:

* under one plan, two releases of a pool are at least the plan's interval ``I = D/R``
  apart (``D`` a day, ``R`` the plan's releases a day), across restarts too: a process
  releases a pool first one interval after it first sees it, under the plan the
  restored inventory gives, which is the plan the process before it last used;
* when the plan changes from interval ``I`` to ``J``, the first release under the new
  one comes at least ``I + J`` after the last release under the old one (or, if this
  process has released none yet, after it first saw the pool).

With each release charged ``ε·I/D`` for its own plan's ``I``, any 24 hours then hold at
most ``ε`` (docs/privacy-utility.md has the proof); the accountant
(:class:`~controller.privacy.Ledger`) checks the same bound and refuses what would break
it, so a configuration reloaded in place can never overspend either.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from controller.privacy import Ledger, Plan, release_epsilon
from controller.redactionconfig import PoolPrivacy


@dataclass
class PoolSchedule:
    plan: Plan
    #: When the next release is due.
    next_at: float
    #: The last release under ``plan``, or when this process first saw the pool.
    anchor: float


@dataclass
class Schedules:
    """Each private pool topic's plan and next release."""

    pools: dict[str, PoolSchedule] = field(default_factory=dict)
    #: The most hosts each pool topic has had (restored, or seen since).
    inventory: dict[str, int] = field(default_factory=dict)

    def restore(self, counts: Iterable[tuple[str, int]]) -> None:
        """The inventory a restart restored (before any host is seen): the pool's plan
        is then the one the process before this one last used."""
        for topic, hosts in counts:
            self.inventory[topic] = max(self.inventory.get(topic, 0), hosts)

    def see(self, topic: str, hosts: int, now: float, sizer: Callable[[int], Plan]) -> None:
        """An observation of a pool with ``hosts`` hosts; ``sizer`` gives the plan for an
        inventory (from the configuration in force)."""
        if topic not in self.pools:
            # Begin under the plan of what was restored (the last one before a restart),
            # then move to the one of what is seen now.
            known = self.inventory.get(topic, 0) or hosts
            plan = sizer(known)
            self.pools[topic] = PoolSchedule(plan, now + plan.release_interval, now)
        self.inventory[topic] = max(self.inventory.get(topic, 0), hosts)
        self.check(topic, now, sizer)

    def check(self, topic: str, now: float, sizer: Callable[[int], Plan]) -> None:
        """Start the pool's schedule, or move it to a new plan with the spacing above."""
        plan = sizer(self.inventory.get(topic, 0))
        state = self.pools.get(topic)
        if state is None:
            self.pools[topic] = PoolSchedule(plan, now + plan.release_interval, now)
        elif plan != state.plan:
            state.next_at = max(state.next_at,
                                state.anchor + state.plan.release_interval + plan.release_interval)
            state.plan = plan

    def due(self, now: float) -> list[str]:
        return sorted(t for t, s in self.pools.items() if s.next_at <= now)

    def released(self, topic: str, now: float, *, charged: bool) -> None:
        """A due slot passed: the next is one interval on; ``charged``: a release went out
        (it anchors a later change of plan)."""
        state = self.pools[topic]
        state.next_at = now + state.plan.release_interval
        if charged:
            state.anchor = now

    def plan(self, topic: str) -> Plan | None:
        state = self.pools.get(topic)
        return None if state is None else state.plan

    def next_at(self, topic: str) -> float | None:
        state = self.pools.get(topic)
        return None if state is None else state.next_at

    def times(self) -> list[float]:
        return [s.next_at for s in self.pools.values()]

    def topics(self) -> list[str]:
        return sorted(self.pools)

    def forget(self, topic: str) -> None:
        self.pools.pop(topic, None)
        self.inventory.pop(topic, None)


def pool_privacy(schedules: Schedules, ledger: Ledger, plan_of: Callable[[str], Plan],
                 now: float) -> list[PoolPrivacy]:
    """Each private pool's plan in force, budget and spending over the last 24 hours
    (``harmonctl -C privacy``)."""
    out = []
    for topic in sorted(set(schedules.topics()) | set(ledger.topics())):
        _, pool, gpu_class = topic.split("/", 2)
        plan = plan_of(topic)
        nxt = schedules.next_at(topic)
        out.append(PoolPrivacy(
            pool, gpu_class, plan.epsilon_per_day, ledger.spent(topic, now),
            ledger.releases(topic, now), release_epsilon(plan), plan.release_interval,
            schedules.inventory.get(topic, 0), plan.gpu_scale, plan.host_scale,
            None if nxt is None else max(0.0, nxt - now)))
    return out
