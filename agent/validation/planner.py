"""Sans-I/O: which device to validate, when, and whom to tell first.

Triggers, in order: an operator's request (``harmonctl validate``, or
``harmonctl release`` of a quarantined GPU), a quarantined GPU whose
recommended repair has evidently been done, a GPU the health engine made
suspect, and, where configured, a schedule that only uses idle windows.
One validation at a time per device and at most ``max_parallel`` in all;
a cooldown per device (operators are exempt). A device a tenant's process
uses is validated only if every job on it allows a pause that long, and then
only after the jobs were told, ``notice_lead`` seconds ahead; where a job on
it negotiates maintenance windows (its declaration gives a checkpoint cadence),
at least its condition's least notice ahead, so the window can be negotiated.

A notice can be answered, as in Azure Scheduled Events: a job that approves says
it is ready (the validation starts at once when every job told of it approved),
and a job whose declaration allows it may defer the start once, by up to its
``max_validation_defer``. A plan that no longer starts as announced (a job
withdrew its allowance, the device went) is cancelled, and its jobs are told.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

from agent.gpu.interface import JobRef
from agent.validation.causes import cause_of
from harmonaize.maintenancetables import NOTICE_MARGIN, URGENCY
from harmonaize.maintenancetables import ValidationCause as Cause

#: Triggers that an operator asked for: exempt from cooldowns.
OPERATOR_TRIGGERS = frozenset({"operator", "release"})


def lead(notice_lead: float, cause: Cause, negotiates: bool) -> float:
    """Seconds between telling a device's jobs and validating it: the host's own lead,
    or, where a job on it negotiates, its condition's least notice and a margin (never
    later than the condition may wait)."""
    if not negotiates:
        return notice_lead
    urgency = URGENCY[cause]
    return min(max(notice_lead, urgency.least_notice + NOTICE_MARGIN), urgency.most_wait)


@dataclass(frozen=True)
class Device:
    key: str                   # "gpu:3", or "host"
    gpu: int | None
    state: str                 # the GPU's health state ("healthy" for the host)
    jobs: tuple[JobRef, ...] = ()
    #: Quarantined, and its recommended repair has evidently been done since.
    repaired: bool = False
    #: Why the GPU domain holds it (its "Finding: message"), to name the condition.
    why: str = ""


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
    #: This host's name for the plan, which the notices carry (unique per agent run).
    id: str = ""
    #: Jobs that approved an early start, and jobs that deferred it (once each).
    approved: frozenset[str] = frozenset()
    deferred: frozenset[str] = frozenset()
    #: The condition behind it, and when its jobs were first told (its wait's bound
    #: counts from then).
    cause: Cause = Cause.ROUTINE
    issued_at: float = 0.0
    #: The window its jobs' tenant negotiated and the host took (0: none).
    window: float = 0.0

    @property
    def jobs(self) -> tuple[str, ...]:
        return tuple(job for job, _ in self.notices)


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
    #: Prefix of plan ids (the service makes it unique per agent run).
    id_prefix: str = "v"
    #: Plans whose jobs were told and that will not start as announced (taken by the
    #: service with :meth:`take_cancelled`, to tell the jobs).
    cancelled: list[Plan] = field(default_factory=list)
    #: Devices whose validation waits for their jobs to end, or runs after waiting:
    #: the host wants to be idle (the controller reserves it in the scheduler).
    idle_wanted: set[str] = field(default_factory=set)
    _numbered: int = 0

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
        negotiates: Callable[[str], bool] = lambda job: False,
    ) -> tuple[list[Plan], list[Plan]]:
        """(plans to start now, plans just scheduled whose jobs must be told now).
        ``negotiates`` says whether a job's declaration asks for negotiable notices."""
        by_key = {d.key: d for d in devices}
        starts, announced = [], []
        busy = len(running) + sum(1 for p in self.scheduled.values() if p.start_at > now)
        for key, plan in list(self.scheduled.items()):
            device = by_key.get(key)
            if plan.start_at > now:
                continue
            del self.scheduled[key]
            if device is None or key in running:
                self.cancelled.append(plan)
                continue
            if not self._allowed(device, plan.pause, allowance):
                self.waiting[key] = "a job on it no longer allows the pause"
                self.cancelled.append(plan)
                continue
            starts.append(plan)
        busy += len(starts)
        self.waiting = {k: v for k, v in self.waiting.items() if k in by_key}
        waited = self.idle_wanted
        self.idle_wanted = set()
        for device in sorted(by_key.values(), key=lambda d: d.key):
            if busy >= self.settings.max_parallel:
                break
            if (device.key in running or device.key in self.scheduled
                    or any(p.key == device.key for p in starts)):
                continue  # one at a time: a plan starting now is not planned again
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
                self._numbered += 1
                cause = cause_of(device.state, device.why, trigger)
                ahead = lead(self.settings.notice_lead, cause,
                             any(negotiates(job) for job, _ in notices))
                plan = Plan(device.key, device.gpu, level, trigger, now + ahead, pause,
                            notices, f"{self.id_prefix}-{self._numbered}", cause=cause,
                            issued_at=now)
                self.scheduled[device.key] = plan
                announced.append(plan)
            else:
                starts.append(Plan(device.key, device.gpu, level, trigger, now, pause))
            busy += 1
        started = running | {p.key for p in starts}
        # Every wait is for a tenant's jobs to end; a validation that waited keeps the
        # host reserved until it is done.
        self.idle_wanted |= set(self.waiting) | {key for key in waited if key in started}
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
        plan = self.scheduled.pop(key, None)
        if plan is not None and plan.notices:
            self.cancelled.append(plan)
        self.requests.pop(key, None)

    def take_cancelled(self) -> list[Plan]:
        cancelled, self.cancelled = self.cancelled, []
        return cancelled

    def answer(self, plan_id: str, job: str, now: float, *, approve: bool = False,
               defer: float = 0.0, max_defer: float = 0.0,
               start: float = 0.0) -> tuple[Plan | None, str]:
        """A job's answer to its notice: (the plan as it now stands, or None; what was
        done or why nothing was). ``max_defer`` is what the job's declaration allows on
        this host; a deferral beyond it is cut to it. ``start`` is a window the job's
        tenant negotiated: the plan starts then, if its condition may wait that long."""
        plan = next((p for p in self.scheduled.values() if p.id == plan_id), None)
        if plan is None:
            return None, "no such scheduled validation (it started or was cancelled)"
        if job not in plan.jobs:
            return None, f"job {job} was not told of this validation"
        if start:
            # The window supersedes a deferral; an approval still starts it early.
            moved, why = self._window(plan, start, now)
            if moved is None or not approve:
                return moved, why
            plan = moved
        if approve:
            plan = replace(plan, approved=plan.approved | {job})
            if set(plan.jobs) <= plan.approved:
                plan = replace(plan, start_at=min(plan.start_at, now))
                why = "every job approved: it starts now"
            else:
                why = "approved; it starts early once every job told of it approved"
        else:
            if job in plan.deferred:
                return None, f"job {job} deferred it once already"
            seconds = min(defer or max_defer, max_defer)
            if seconds <= 0:
                return None, f"job {job}'s declaration allows no deferral"
            plan = replace(plan, start_at=plan.start_at + seconds,
                           deferred=plan.deferred | {job})
            why = f"deferred by {seconds:.0f} s"
        self.scheduled[plan.key] = plan
        return plan, why

    def _window(self, plan: Plan, start: float, now: float) -> tuple[Plan | None, str]:
        """A negotiated window: the controller settled it within the condition's bound;
        the host checks the bound again (its own table, from when it told the jobs), so
        no answer can hold an urgent validation back longer than its condition allows."""
        latest = plan.issued_at + URGENCY[plan.cause].most_wait
        if start > latest:
            return None, (f"the window at {start:.0f} is later than a {plan.cause.value} "
                          f"validation may wait (until {latest:.0f})")
        if start == plan.start_at:
            plan = replace(plan, window=start)
            self.scheduled[plan.key] = plan
            return plan, "the agreed window is the planned start"
        moved = replace(plan, start_at=max(start, now), window=start)
        self.scheduled[plan.key] = moved
        return moved, f"moved to the agreed window at {moved.start_at:.0f}"


def _notices(jobs: tuple[JobRef, ...]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    ranks: dict[str, set[str]] = {}
    for ref in jobs:
        ranks.setdefault(ref.job, set())
        if ref.rank:
            ranks[ref.job].add(ref.rank)
    return tuple((job, tuple(sorted(r))) for job, r in sorted(ranks.items()))
