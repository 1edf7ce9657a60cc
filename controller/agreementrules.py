"""The agreement's choosing rules: which reports count, what the job wants, whether a
communicator may change, and where the change switches (see controller/agreement.py).

Choosing: the most severe fresh wish wins (congestion anywhere on the job's
paths slows every rank of a collective alike). A rise is decided at once; a
fall only once the lower wish lasted ``hold`` seconds; changes of the choice
are limited per minute. ``at`` is past every host's projected position: the
highest count reported, projected at its rate, plus the fastest rate times
``lead`` (at least ``margin``). A communicator is not changed again before
every host reported all its ranks past its previous switch, nor while a rank
waits, refused a copy, or disagrees.

Detection: every host's switch records of a communicator are compared
(:func:`harmonaize.switches.disagreement`); a disagreement marks the job
``diverged`` (sticky while the communicator lives), waiting ranks mark it
``paused``. Ranks can wait only on a host that may have armed, so no change is armed
while a host of the job is unreachable (the shell says which are reachable at each
:meth:`step`): its report stays fresh for ``report_ttl`` after it fell silent, and an
arm sent then would be cancelled after ``arm_timeout`` while its tenant is told
``paused`` until that host comes back, though no rank ever waited.

Pure functions of a job's state, the settings and ``now``; the protocol that arms and
resolves what they choose is in controller/agreement.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from controller.agreementstate import (
    DEFAULT_CHOICE,
    MAX_AT,
    AgreementSettings,
    Decision,
    JobState,
    Report,
)
from harmonaize.messages import CommReport
from harmonaize.switches import Record, disagreement

#: Each communicator's views: (host, what that host reported of it).
Views = list[tuple[str, CommReport]]


def fresh(settings: AgreementSettings, job: JobState, now: float) -> dict[str, Report]:
    """The reports that still count (not older than ``report_ttl``)."""
    return {h: r for h, r in sorted(job.reports.items())
            if now - r.received <= settings.report_ttl}


def detect(settings: AgreementSettings, job: JobState, now: float) -> None:
    """Compare every host's switch records of each communicator."""
    records: dict[int, list[Record]] = {}
    flagged: dict[int, str] = {}
    for host, report in fresh(settings, job, now).items():
        for comm in report.report.comms:
            group = records.setdefault(comm.comm, [])
            for state in (comm.ahead, comm.behind):
                group.append(Record(state.switches, state.history, state.prev_history,
                                    state.last_switch, state.collectives))
            if comm.diverged:
                flagged[comm.comm] = f"host {host} saw its own ranks disagree"
    alive = set(records)
    for comm in list(job.diverged):
        if comm not in alive:
            del job.diverged[comm]  # the communicator is gone
    for comm, group in records.items():
        why = flagged.get(comm) or disagreement(group)
        if why and comm not in job.diverged:
            job.diverged[comm] = why


def target(settings: AgreementSettings, job: JobState, reports: Mapping[str, Report],
           now: float) -> tuple[int, str] | None:
    """The (severity, choice) to switch to now, if any, after hysteresis."""
    if job.withdrawn:
        return (0, DEFAULT_CHOICE) if job.choice != DEFAULT_CHOICE else None
    top = max(r.report.severity for r in reports.values())
    want = (top, min(r.report.want for r in reports.values() if r.report.severity == top))
    if top > job.severity:
        job.lower_since = None
        return want
    if top == job.severity:
        job.lower_since = None
        return want if want[1] != job.choice else None
    if job.lower_since is None:
        job.lower_since, job.lower_want = now, want
        return None
    job.lower_want = max(job.lower_want, want)
    return job.lower_want if now - job.lower_since >= settings.hold else None


def rate_limited(settings: AgreementSettings, job: JobState, now: float) -> bool:
    while job.changes and now - job.changes[0] >= 60.0:
        job.changes.popleft()
    return len(job.changes) >= settings.max_decisions_per_minute


def by_comm(reports: Mapping[str, Report]) -> dict[int, Views]:
    comms: dict[int, Views] = {}
    for host, report in reports.items():
        for comm in report.report.comms:
            comms.setdefault(comm.comm, []).append((host, comm))
    return comms


def not_ready(job: JobState, comm: int, views: Views) -> str:
    """Why a communicator may not change now ("" if it may)."""
    n_ranks = max(v.n_ranks for _, v in views)
    seen = sum(v.ranks for _, v in views)
    if seen != n_ranks:
        return f"{seen} of its {n_ranks} ranks reported"
    if comm in job.diverged:
        return f"its ranks disagree: {job.diverged[comm]}"
    for host, view in views:
        if view.pending:
            return f"host {host} still has a change pending"
        if view.waiting:
            return f"{view.waiting} rank(s) on host {host} wait"
        if view.refused:
            return f"a rank on host {host} refused the newest copy"
        if view.at and view.collectives_min <= view.at:
            return f"a rank on host {host} has not passed the switch at {view.at}"
    choices = {v.choice for _, v in views}
    if len(choices) > 1:
        return f"hosts follow different rules for it ({', '.join(sorted(choices))})"
    return ""


def activation(settings: AgreementSettings, views: Views, reports: Mapping[str, Report],
               now: float) -> int:
    """Past every host's projected position, with a lead."""
    projected, fastest = 0.0, 0.0
    for host, view in views:
        age = max(0.0, now - reports[host].received)
        projected = max(projected, view.collectives_max + view.per_second * age)
        fastest = max(fastest, view.per_second)
    lead = max(settings.margin, math.ceil(fastest * settings.lead))
    return min(MAX_AT, math.ceil(projected) + lead)


def settled_default(settings: AgreementSettings, job: JobState, now: float) -> bool:
    reports = fresh(settings, job, now)
    return not reports or all(c.choice in (DEFAULT_CHOICE, "") and not c.pending
                              for r in reports.values() for c in r.report.comms)


def unaccounted(decision: Decision) -> str:
    """Every rank of every communicator must have armed: the hosts' counts add up."""
    for armed in decision.activations:
        views = [c for reports in decision.ack_reports.values() for c in reports
                 if c.comm == armed.comm]
        if not views:
            return f"no host armed communicator {armed.comm:#x}"
        n_ranks = max(v.n_ranks for v in views)
        seen = sum(v.ranks for v in views)
        if seen != n_ranks:
            return f"communicator {armed.comm:#x}: {seen} of its {n_ranks} ranks armed"
    return ""
