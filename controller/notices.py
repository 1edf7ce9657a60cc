"""Validation notices a tenant can answer, with no I/O.

A host announces a planned validation with a notice per job (its own plan id,
never shown to a tenant). The controller names each (host, plan, job) with a
notice id of its own, drawn at random, and keeps what it told the tenant: the
status, when it starts, whether the job approved or deferred it. A tenant's
answer (:class:`~harmonaize.messages.ValidationAnswer`) is checked here against
that record and the job's declaration, and becomes a
:class:`~harmonaize.messages.ValidationDecision` for the host that planned it,
which applies it (and checks the declaration again). The host's next notice,
with the same plan id, shows the tenant the outcome.

The rules, after Azure Scheduled Events: ``approve`` lets a scheduled
validation start now (once every job told of it approved); ``defer`` moves its
start later, once per notice, by at most the declaration's
``max_validation_defer``; a started or cancelled notice takes no answer.
Records are kept (and stored) until an hour after the pause could have ended,
so a late answer is told the notice started rather than that it never existed.

A notice belongs to the placement it was issued for (the job, its tenant and the
placement's generation): when the job is placed anew (for another tenant, or for
the same one on other members) its notices are void. They are dropped, never sent
to a host again, and an answer to one gets the very refusal an unknown id gets, so
nobody learns that it existed; the host's next notice of the same plan is a new
notice, for the new placement's tenant.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

from controller.types import Placement
from harmonaize.messages import (
    ErrorCode,
    NoticeAction,
    NoticeStatus,
    ValidationAnswer,
    ValidationDecision,
)

#: Seconds a record is kept after its pause could have ended.
KEEP_AFTER = 3600.0


@dataclass(frozen=True)
class Notice:
    """What the controller told one job about one planned validation."""

    id: str
    tenant: str
    job: str
    host: str
    #: The host's own id of the plan.
    plan: str
    status: NoticeStatus = NoticeStatus.SCHEDULED
    #: Unix time the pause starts no earlier than, and how long it may last.
    not_before: float = 0.0
    pause: float = 0.0
    approved: bool = False
    #: Seconds the tenant deferred it by (0: not deferred).
    deferred: float = 0.0
    #: The generation of the job's placement it was issued for.
    placement: int = 0
    #: The start agreed in a maintenance negotiation (Unix time; 0: none), which the
    #: host is told as it is told a deferral.
    window: float = 0.0

    def belongs_to(self, placement: Placement | None) -> bool:
        """Whether ``placement`` (the job's current one) is the one it was issued for."""
        return (placement is not None and placement.job == self.job
                and placement.tenant == self.tenant
                and placement.generation == self.placement)

    @property
    def forget_at(self) -> float:
        return self.not_before + self.pause + KEEP_AFTER

    def decision(self) -> ValidationDecision | None:
        """What the host must know of the tenant's answers (None: nothing answered)."""
        if not (self.approved or self.deferred or self.window):
            return None
        return ValidationDecision(self.plan, self.job, approve=self.approved,
                                  defer=self.deferred, start=self.window)

    def to_plain(self) -> dict[str, object]:
        return {"id": self.id, "tenant": self.tenant, "job": self.job, "host": self.host,
                "plan": self.plan, "status": self.status.value, "not_before": self.not_before,
                "pause": self.pause, "approved": self.approved, "deferred": self.deferred,
                "placement": self.placement, "window": self.window}

    @classmethod
    def from_plain(cls, value: dict[str, object]) -> Notice:
        return cls(str(value["id"]), str(value["tenant"]), str(value["job"]),
                   str(value["host"]), str(value["plan"]), NoticeStatus(value["status"]),
                   float(value["not_before"]), float(value["pause"]),  # type: ignore[arg-type]
                   bool(value["approved"]), float(value["deferred"]),  # type: ignore[arg-type]
                   int(value.get("placement", 0)),  # type: ignore[call-overload]
                   float(value.get("window", 0.0)))  # type: ignore[arg-type]


class Notices:
    def __init__(self, restored: tuple[Notice, ...] = (), *,
                 rng: random.Random | None = None) -> None:
        self.by_id: dict[str, Notice] = {n.id: n for n in restored}
        self._by_plan = {(n.host, n.plan, n.job): n.id for n in restored}
        self._rng = rng or random.Random()
        self._dirty: dict[str, Notice | None] = {}
        #: Records kept per host and per job (bounded by the configuration).
        self._per_host = Counter(n.host for n in restored)
        self._per_job = Counter(n.job for n in restored)

    def id_for(self, host: str, plan: str, job: str) -> str:
        """The tenant's id of a host's plan for one job (a new one the first time: random,
        so it says nothing of the host, the plan or how many notices there were)."""
        known = self._by_plan.get((host, plan, job))
        if known is not None:
            return known
        while True:
            candidate = f"vn-{self._rng.getrandbits(64):016x}"
            if candidate not in self.by_id:
                return candidate

    def record(self, notice: Notice) -> None:
        """The host's notice as the tenant was told it (its answers are kept)."""
        old = self.by_id.get(notice.id)
        if old is not None and old.placement == notice.placement:
            notice = replace(notice, approved=old.approved, deferred=old.deferred,
                             window=old.window)
        self._put(notice)

    def full(self, host: str, job: str, per_host: int, per_job: int) -> bool:
        """Whether the host or the job has as many notices as may be kept."""
        return self._per_host[host] >= per_host or self._per_job[job] >= per_job

    def get(self, notice_id: str) -> Notice | None:
        return self.by_id.get(notice_id)

    def answer(self, tenant: str, answer: ValidationAnswer, max_defer: float,
               placement: Placement | None) -> tuple[ErrorCode, str] | ValidationDecision:
        """A tenant's answer: the decision for the host, or why it is refused.
        ``max_defer`` is the job's declared ``max_validation_defer``, ``placement`` the
        job's placement now (the notice's own, or the answer is refused)."""
        notice = self.by_id.get(answer.notice)
        if notice is None or notice.tenant != tenant or not notice.belongs_to(placement):
            # The same answer for "not yours" and "no such notice": no probing.
            return ErrorCode.NO_SUCH_NOTICE, f"no validation notice {answer.notice!r} of yours"
        if notice.status is not NoticeStatus.SCHEDULED:
            return ErrorCode.NOTICE_STARTED, f"notice {notice.id} is {notice.status.value}"
        if answer.action is NoticeAction.APPROVE:
            notice = replace(notice, approved=True)
        else:
            if notice.deferred:
                return (ErrorCode.NOT_DEFERRABLE,
                        f"notice {notice.id} was deferred once already")
            if notice.window:
                return (ErrorCode.NOT_DEFERRABLE, f"notice {notice.id} has a negotiated "
                        "maintenance window: it starts then, or earlier if you approve")
            if max_defer <= 0:
                return (ErrorCode.NOT_DEFERRABLE, f"job {notice.job}'s declaration allows "
                        "no deferral (max_validation_defer)")
            if answer.seconds > max_defer:
                return (ErrorCode.INVALID, f"validation-answer.seconds: {answer.seconds:g} is "
                        f"above the declared max_validation_defer {max_defer:g}")
            notice = replace(notice, deferred=answer.seconds or max_defer)
        self._put(notice)
        decision = notice.decision()
        assert decision is not None
        return decision

    def settle_window(self, notice_id: str, start: float) -> ValidationDecision | None:
        """A negotiated window for a notice still scheduled: the decision for its host
        (None: the notice is gone or started)."""
        notice = self.by_id.get(notice_id)
        if notice is None or notice.status is not NoticeStatus.SCHEDULED:
            return None
        self._put(replace(notice, window=start))
        return self.by_id[notice_id].decision()

    def defer_left(self, notice_id: str, max_defer: float) -> float:
        """Seconds the tenant may still defer the notice by."""
        notice = self.by_id.get(notice_id)
        if notice is not None and (notice.deferred or notice.window or notice.status is not
                                   NoticeStatus.SCHEDULED):
            return 0.0
        return max_defer

    def of_host(self, host: str) -> list[ValidationDecision]:
        """Answers a (re)connecting host must hear again (it applies each once)."""
        return [d for n in self.by_id.values()
                if n.host == host and n.status is NoticeStatus.SCHEDULED
                and (d := n.decision()) is not None]

    def of_tenant(self, tenant: str) -> list[Notice]:
        return sorted((n for n in self.by_id.values() if n.tenant == tenant),
                      key=lambda n: (n.not_before, n.id))

    def forget_job(self, job: str) -> int:
        """Drop the job's notices (it ended, or was placed anew); how many there were."""
        gone = [n for n in self.by_id.values() if n.job == job]
        for notice in gone:
            self._drop(notice)
        return len(gone)

    def expire(self, wall: float) -> None:
        for notice in [n for n in self.by_id.values() if n.forget_at < wall]:
            self._drop(notice)

    def take_dirty(self) -> dict[str, Notice | None]:
        dirty, self._dirty = self._dirty, {}
        return dirty

    def _put(self, notice: Notice) -> None:
        if notice.id not in self.by_id:
            self._per_host[notice.host] += 1
            self._per_job[notice.job] += 1
        self.by_id[notice.id] = self._dirty[notice.id] = notice
        self._by_plan[(notice.host, notice.plan, notice.job)] = notice.id

    def _drop(self, notice: Notice) -> None:
        del self.by_id[notice.id]
        for counts, key in ((self._per_host, notice.host), (self._per_job, notice.job)):
            counts[key] -= 1
            if counts[key] <= 0:
                del counts[key]
        self._by_plan.pop((notice.host, notice.plan, notice.job), None)
        self._dirty[notice.id] = None
