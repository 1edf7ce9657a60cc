"""Sans-I/O: which device to validate, when, and whom to tell first.

Triggers, in order: an operator's request (``harmonctl validate``, or
``harmonctl release`` of a quarantined GPU), a quarantined GPU whose
recommended repair has evidently been done, a GPU the health engine made
suspect, and, where configured, a schedule that only uses idle windows.
One validation at a time per device and at most ``max_parallel`` in all;
a cooldown per device (operators are exempt). A device a tenant's process
uses is validated only if every job on it allows a pause that long, and then
only after the jobs were told, ``notice_lead`` seconds ahead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from agent.gpu.types import JobRef

#: Triggers that an operator asked for: exempt from cooldowns.
OPERATOR_TRIGGERS = frozenset({"operator", "release"})


@dataclass(frozen=True)
class Device:
    key: str                   # "gpu:3", or "host"
    gpu: int | None
    state: str                 # the GPU's health state ("healthy" for the host)
    jobs: tuple[JobRef, ...] = ()
    #: Quarantined, and its recommended repair has evidently been done since.
    repaired: bool = False


@dataclass(frozen=True)
class Plan:
    key: str
    gpu: int | None
    level: int
    trigger: str
    start_at: float
    #: Seconds the validation may pause the device's jobs.
    pause: float
    #: (job, its ranks on the device) told of the pause before it starts.
    notices: tuple[tuple[str, tuple[str, ...]], ...] = ()


@dataclass(frozen=True)
class Request:
    key: str
    level: int
    trigger: str


@dataclass
class PlannerSettings:
    suspect_level: int = 2
    cooldown: float = 1800.0
    schedule_interval: float = 0.0
    max_parallel: int = 2
    notice_lead: float = 30.0


@dataclass
class Planner:
    settings: PlannerSettings
    #: Seconds a validation of a device at a level may take (the pause it may cause).
    budget: Callable[[str, int], float]
    requests: dict[str, Request] = field(default_factory=dict)
    scheduled: dict[str, Plan] = field(default_factory=dict)
    #: Why a request or a suspect device is still waiting, for the operator.
    waiting: dict[str, str] = field(default_factory=dict)

    def request(self, key: str, level: int, trigger: str = "operator") -> None:
        self.requests[key] = Request(key, level, trigger)

    def step(
        self,
        devices: Iterable[Device],
        now: float,
        *,
        running: set[str],
        last_done: Mapping[str, float],
        allowance: Callable[[str], float],
    ) -> tuple[list[Plan], list[Plan]]:
        """(plans to start now, plans just scheduled whose jobs must be told now)."""
        by_key = {d.key: d for d in devices}
        starts, announced = [], []
        busy = len(running) + sum(1 for p in self.scheduled.values() if p.start_at > now)
        for key, plan in list(self.scheduled.items()):
            device = by_key.get(key)
            if plan.start_at > now:
                continue
            del self.scheduled[key]
            if device is None or key in running:
                continue
            if not self._allowed(device, plan.pause, allowance):
                self.waiting[key] = "a job on it no longer allows the pause"
                continue
            starts.append(plan)
        busy += len(starts)
        self.waiting = {k: v for k, v in self.waiting.items() if k in by_key}
        for device in sorted(by_key.values(), key=lambda d: d.key):
            if busy >= self.settings.max_parallel:
                break
            if device.key in running or device.key in self.scheduled:
                continue
            wanted = self._wanted(device, now, last_done)
            if wanted is None:
                continue
            level, trigger = wanted
            pause = self.budget(device.key, level)
            if device.jobs and not self._allowed(device, pause, allowance):
                self.waiting[device.key] = (
                    f"a tenant's job uses it and does not allow a {pause:.0f} s pause")
                continue
            self.requests.pop(device.key, None)
            self.waiting.pop(device.key, None)
            if device.jobs:
                notices = _notices(device.jobs)
                plan = Plan(device.key, device.gpu, level, trigger,
                            now + self.settings.notice_lead, pause, notices)
                self.scheduled[device.key] = plan
                announced.append(plan)
            else:
                starts.append(Plan(device.key, device.gpu, level, trigger, now, pause))
            busy += 1
        return starts, announced

    def _wanted(self, device: Device, now: float,
                last_done: Mapping[str, float]) -> tuple[int, str] | None:
        request = self.requests.get(device.key)
        if request is not None:
            return request.level, request.trigger
        if device.state == "quarantined" and device.repaired:
            # The repair happened after the quarantine: new evidence, no cooldown.
            return self.settings.suspect_level, "after-repair"
        cooled = now - last_done.get(device.key, float("-inf")) >= self.settings.cooldown
        if device.state == "suspect" and cooled:
            return self.settings.suspect_level, "suspect"
        interval = self.settings.schedule_interval
        if (interval and device.state == "healthy" and not device.jobs
                and now - last_done.get(device.key, float("-inf")) >= interval):
            return self.settings.suspect_level, "schedule"
        return None

    @staticmethod
    def _allowed(device: Device, pause: float, allowance: Callable[[str], float]) -> bool:
        return all(allowance(ref.job) >= pause for ref in device.jobs)

    def cancel(self, key: str) -> None:
        self.scheduled.pop(key, None)
        self.requests.pop(key, None)


def _notices(jobs: tuple[JobRef, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    ranks: dict[str, set[str]] = {}
    for ref in jobs:
        ranks.setdefault(ref.job, set())
        if ref.rank:
            ranks[ref.job].add(ref.rank)
    return tuple((job, tuple(sorted(r))) for job, r in sorted(ranks.items()))
