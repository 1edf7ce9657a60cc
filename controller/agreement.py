"""Multi-host agreement on a job's tuning choice: proposals in, decisions out.

Each host of a job whose NCCL communicators span hosts proposes the choice
its own links call for (:class:`TuningProposal`: a choice name, a severity
0..2 and, per communicator, how many collectives its ranks there have issued
and how fast). Every host must then publish the *same* choice from the *same*
collective on, or ranks pick different algorithms and the job hangs; so the
hosts only apply what this module decides (:class:`TuningDecision`).

* The most severe fresh proposal wins: congestion anywhere on the job's paths
  slows every rank of a collective alike. A rise is decided at once; a fall
  only once the lower wish lasted ``hold`` seconds (to the highest level
  wished for meanwhile), and choice changes are limited per minute.
* Each communicator switches at ``at`` = the highest collective count any
  host reported for it, projected to now at its reported rate, plus the
  fastest rate times ``lead`` (at least ``margin``), so no rank has passed it
  by the time every host has the decision.
* No new choice is decided while a host has not yet reported passing the
  previous activation of a communicator: a rank still before it would
  otherwise read the new "before" rules where its peers followed the old.
* A communicator that appears while a non-default choice is in force is
  added to the decision (same choice, its own activation); one that joins
  under the default needs nothing, since unlisted means NCCL's own choice.

Pure: time is a parameter and nothing here does I/O, so the controller owns
storage and transport (and can seed decision numbers so they keep rising
across its restarts).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from harmonaize.messages import Activation, TuningDecision, TuningProposal

DEFAULT_CHOICE = "default"
MAX_ACTIVATIONS = 32
MAX_AT = 2**62


@dataclass(frozen=True)
class AgreementSettings:
    #: Seconds a less severe wish must last before the decision steps down.
    hold: float = 10.0
    max_decisions_per_minute: int = 4
    #: Seconds of collectives, at the fastest reported rate, between deciding and activation.
    lead: float = 2.0
    #: ... and at least this many collectives.
    margin: int = 100
    #: A host's proposal older than this no longer counts (the host went quiet).
    proposal_ttl: float = 60.0


@dataclass(frozen=True)
class _Report:
    proposal: TuningProposal
    received: float


@dataclass
class _Job:
    hosts: frozenset[str] | None = None
    reports: dict[str, _Report] = field(default_factory=dict)
    current: TuningDecision | None = None
    severity: int = 0
    decided_at: float = float("-inf")
    number: int = 0
    changes: deque[float] = field(default_factory=deque)
    lower_since: float | None = None
    lower_want: tuple[int, str] = (0, DEFAULT_CHOICE)
    revision: int = -1
    refresh: bool = False
    waiting: str = ""
    #: Activations that changed something and are not yet reported passed by every
    #: host that has the communicator: comm -> (at, when decided).
    guard: dict[int, tuple[int, float]] = field(default_factory=dict)


class Agreement:
    def __init__(self, settings: AgreementSettings | None = None, *,
                 numbers: Mapping[str, int] | None = None) -> None:
        """``numbers``: the last decision number sent per job (decision numbers only
        ever rise, so agents can drop repeats)."""
        self.settings = settings or AgreementSettings()
        self._numbers = dict(numbers or {})
        self._jobs: dict[str, _Job] = {}

    def _job(self, name: str) -> _Job:
        job = self._jobs.get(name)
        if job is None:
            job = self._jobs[name] = _Job(number=self._numbers.get(name, 0))
        return job

    # --- inputs ----------------------------------------------------------------------

    def set_hosts(self, job: str, hosts: Iterable[str] | None) -> None:
        """The hosts a job runs on (from its placement); only their proposals count.
        ``None``: whoever proposes."""
        state = self._job(job)
        state.hosts = None if hosts is None else frozenset(hosts)
        if state.hosts is not None:
            for host in set(state.reports) - state.hosts:
                del state.reports[host]

    def propose(self, host: str, proposal: TuningProposal, now: float) -> None:
        state = self._job(proposal.job)
        if state.hosts is not None and host not in state.hosts:
            return  # not (or no longer) one of the job's hosts
        state.reports[host] = _Report(proposal, now)

    def declared(self, job: str, revision: int) -> None:
        """A new declaration revision went to the job's hosts: the rules behind the
        choice in force change, so its communicators are switched again (at agreed
        points) once nothing is pending."""
        state = self._job(job)
        if revision > state.revision:
            state.refresh = state.revision >= 0 and state.current is not None
            state.revision = revision

    def forget(self, job: str) -> None:
        state = self._jobs.pop(job, None)
        if state is not None:
            self._numbers[job] = state.number

    def forget_host(self, host: str) -> None:
        for state in self._jobs.values():
            state.reports.pop(host, None)

    # --- outputs ---------------------------------------------------------------------

    def current(self, job: str) -> TuningDecision | None:
        """The decision in force (resend it to a host that reconnects)."""
        state = self._jobs.get(job)
        return state.current if state else None

    def step(self, now: float) -> list[TuningDecision]:
        """Decisions to send now, each to every host of its job."""
        out = []
        for name in sorted(self._jobs):
            decision = self._step_job(name, self._jobs[name], now)
            if decision is not None:
                out.append(decision)
        return out

    def status(self, job: str) -> dict[str, Any]:
        state = self._jobs.get(job)
        if state is None:
            return {}
        return {
            "choice": state.current.choice if state.current else DEFAULT_CHOICE,
            "decision": state.number,
            "severity": state.severity,
            "waiting": state.waiting,
            "proposals": {h: {"choice": r.proposal.choice, "severity": r.proposal.severity,
                              "received": r.received}
                          for h, r in sorted(state.reports.items())},
        }

    # --- the rules -------------------------------------------------------------------

    def _fresh(self, state: _Job, now: float) -> dict[str, _Report]:
        return {h: r for h, r in sorted(state.reports.items())
                if now - r.received <= self.settings.proposal_ttl}

    def _target(self, state: _Job, fresh: dict[str, _Report], now: float
                ) -> tuple[int, str] | None:
        """The (severity, choice) to switch to now, if any, after hysteresis."""
        top = max(r.proposal.severity for r in fresh.values())
        want = (top, min(r.proposal.choice for r in fresh.values()
                         if r.proposal.severity == top))
        current = state.current.choice if state.current else DEFAULT_CHOICE
        if top > state.severity:
            state.lower_since = None
            return want
        if top == state.severity:
            state.lower_since = None
            return want if want[1] != current else None
        if state.lower_since is None:
            state.lower_since, state.lower_want = now, want
            return None
        state.lower_want = max(state.lower_want, want)
        return state.lower_want if now - state.lower_since >= self.settings.hold else None

    def _pending(self, state: _Job, fresh: dict[str, _Report]) -> str:
        """Why a new choice must wait: a host that has a communicator has not yet
        reported it past its last changed activation (hosts report until they have)."""
        why = ""
        for comm, (at, since) in sorted(state.guard.items()):
            behind = [host for host, report in fresh.items()
                      if (p := next((p for p in report.proposal.progress if p.comm == comm),
                                    None)) is not None
                      and (report.received < since or p.collectives < at)]
            if not behind:
                del state.guard[comm]
            elif not why:
                why = f"host {behind[0]} has not reported communicator {comm:#x} past {at}"
        return why

    def _rate_limited(self, state: _Job, now: float) -> bool:
        while state.changes and now - state.changes[0] >= 60.0:
            state.changes.popleft()
        return len(state.changes) >= self.settings.max_decisions_per_minute

    def _activation(self, reports: Iterable[_Report], comm: int, now: float) -> int:
        """Where ``comm`` switches: past every host's projected position, with a lead."""
        projected, fastest = 0.0, 0.0
        for report in reports:
            for progress in report.proposal.progress:
                if progress.comm == comm:
                    age = max(0.0, now - report.received)
                    projected = max(projected, progress.collectives + progress.per_second * age)
                    fastest = max(fastest, progress.per_second)
        lead = max(self.settings.margin, math.ceil(fastest * self.settings.lead))
        return min(MAX_AT, math.ceil(projected) + lead)

    def _decide(self, name: str, state: _Job, choice: str,
                activations: list[Activation], now: float) -> TuningDecision:
        state.number += 1
        decision = TuningDecision(name, choice, state.number,
                                  tuple(sorted(activations, key=lambda a: a.comm)))
        before = {a.comm: a.at for a in state.current.activations} if state.current else {}
        for activation in decision.activations:
            if before.get(activation.comm) != activation.at:
                state.guard[activation.comm] = (activation.at, now)
        state.current, state.decided_at = decision, now
        state.waiting = ""
        state.lower_since = None
        return decision

    def _step_job(self, name: str, state: _Job, now: float) -> TuningDecision | None:
        fresh = self._fresh(state, now)
        if not fresh:
            return None
        reports = list(fresh.values())
        comms = sorted({p.comm for r in reports for p in r.proposal.progress})[:MAX_ACTIVATIONS]
        target = self._target(state, fresh, now)
        current = state.current.choice if state.current else DEFAULT_CHOICE
        if target is not None:
            pending = self._pending(state, fresh)
            if pending:
                state.waiting = f"{target[1]} waits: {pending}"
            elif self._rate_limited(state, now):
                state.waiting = (f"{target[1]} waits: {len(state.changes)} decisions in the "
                                 "last minute")
            else:
                state.changes.append(now)
                state.severity = target[0]
                state.refresh = False
                return self._decide(name, state, target[1],
                                    [Activation(c, self._activation(reports, c, now))
                                     for c in comms], now)
        if current == DEFAULT_CHOICE or state.current is None:
            return None
        if state.refresh and not self._pending(state, fresh):
            state.refresh = False
            return self._decide(name, state, current,
                                [Activation(c, self._activation(reports, c, now))
                                 for c in comms], now)
        covered = {a.comm for a in state.current.activations}
        new = [c for c in comms if c not in covered]
        if new and len(covered) < MAX_ACTIVATIONS:
            room = MAX_ACTIVATIONS - len(covered)
            return self._decide(name, state, current, [
                *state.current.activations,
                *(Activation(c, self._activation(reports, c, now)) for c in new[:room])], now)
        return None
