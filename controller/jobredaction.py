"""What a job's own tenant may be told of it, rebuilt from the controller's own view.

A host's advice or validation notice for a job, and the job's health (which members
are degraded or lost, congestion on its paths, its tuning, the energy it saved), each
built anew for the owning tenant: members in the tenant's own terms, never a host, an
address or a raw count, and only from a host the job is placed on. Pure functions;
controller/redaction.py publishes what they build.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.redactionconfig import RedactionConfig, bucket
from controller.types import HostState, Placement
from harmonaize.maintenancetables import LONGEST_LEAD
from harmonaize.messages import (
    Advice,
    Bucket,
    Health,
    JobAdvisory,
    JobHealth,
    Level,
    NoticeStatus,
    TuningStatus,
    Urgency,
    ValidationCause,
    ValidationNotice,
)

#: The reason classes a tenant may be told (an advisory naming any other is refused).
ADVISORY_REASONS = frozenset({"gpu-memory", "gpu-failure", "interconnect", "thermal"})
#: Members a job-health message lists as degraded, and as lost, at most (the wire's cap).
MEMBERS_LISTED = 1024
#: A validation notice never announces a start further ahead than this (seconds): the
#: longest lead a host gives, its own ([validation] notice_lead, an hour at most) or a
#: negotiable notice's (its condition's least notice and a margin).
NOTICE_HORIZON = max(3600.0, LONGEST_LEAD)


def members_here(placements: Mapping[str, Placement], host_id: str, job: str,
                 named: Iterable[str]) -> tuple[Placement, tuple[str, ...]] | str:
    """The job's placement and its members on the host (those named, or all of them),
    or why the host may not speak for the job."""
    placement = placements.get(job)
    if placement is None:
        return "unplaced"  # a job we do not know of: no tenant to tell
    here = [m.name for m in placement.members if m.host_id == host_id]
    if not here:
        return "not_placed_here"
    wanted = set(named)
    return placement, tuple(sorted(n for n in here if n in wanted) or sorted(here))


def rebuilt_advisory(placements: Mapping[str, Placement], host_id: str,
                     advisory: JobAdvisory) -> tuple[Placement, JobAdvisory] | str:
    """A host's advice for a job, in the controller's own terms, or why not."""
    found = members_here(placements, host_id, advisory.job, advisory.ranks)
    if isinstance(found, str):
        return found
    placement, ranks = found
    if advisory.reason not in ADVISORY_REASONS:
        return "unknown_reason"
    return placement, JobAdvisory(placement.job, Advice(advisory.advice), advisory.reason,
                                  Urgency(advisory.urgency), ranks)


def rebuilt_notice(cfg: RedactionConfig, placements: Mapping[str, Placement], host_id: str,
                   notice: ValidationNotice, wall: float, *, max_pause: float | None,
                   notice_id: str, defer_seconds: float, max_defer: float
                   ) -> tuple[Placement, ValidationNotice] | str:
    """A host's validation notice for a job, in the controller's own terms, or why not:
    a pause within the bound, a start clamped to the horizon (see Redactor.notice)."""
    found = members_here(placements, host_id, notice.job, notice.members)
    if isinstance(found, str):
        return found
    placement, ranks = found
    bound = cfg.undeclared_max_pause if max_pause is None else max_pause
    if not 0 < notice.pause_seconds <= bound:
        return "pause_not_allowed"
    announced = notice.not_before or notice.starts_at
    starts = round(min(max(float(announced), wall), wall + NOTICE_HORIZON + max_defer), 3)
    return placement, ValidationNotice(
        placement.job, ranks, int(notice.pause_seconds), starts, notice_id, starts,
        NoticeStatus(notice.status),
        defer_seconds if notice.status is NoticeStatus.SCHEDULED else 0.0,
        ValidationCause(notice.cause))


def job_health(cfg: RedactionConfig, placement: Placement, hosts: Mapping[str, HostState],
               tuning: tuple[str, TuningStatus]) -> JobHealth:
    """The job's members by their hosts' states, its paths' congestion, its tuning."""
    degraded, lost, congestion = [], [], Level.NONE
    for member in placement.members:
        host = hosts.get(member.host_id)
        if host is None or not host.alive or host.health is Health.UNHEALTHY:
            lost.append(member.name)
            continue
        if (host.health is Health.DEGRADED or not host.schedulable
                or host.gpus.quarantined or host.gpus.lost):
            degraded.append(member.name)
        if cfg.job_congestion:
            for link in host.links:
                if link.link_class == "data" and link.congestion.rank > congestion.rank:
                    congestion = link.congestion
    choice, status = tuning
    # The wire caps each list (a job of more members on failed hardware is told the
    # first ones by name; the tenant guide says so) rather than breaking the message.
    return JobHealth(placement.job, tuple(sorted(degraded)[:MEMBERS_LISTED]),
                     tuple(sorted(lost)[:MEMBERS_LISTED]), congestion,
                     tuning_choice=choice, tuning=status,
                     energy=energy_saved(cfg, placement, hosts))


def energy_saved(cfg: RedactionConfig, placement: Placement,
                 hosts: Mapping[str, HostState]) -> Bucket | None:
    """The share of energy the job's GPUs saved, in percent, as a range: summed over
    the hosts it is placed on (what other hosts say of it is not its), told once
    enough is measured; never a host's figure or a raw count."""
    used = saved = 0
    for host_id in placement.hosts:
        host = hosts.get(host_id)
        for entry in host.energy if host is not None else ():
            if entry.job == placement.job:
                used += entry.used_kj
                saved += entry.saved_kj
    if used + saved < max(cfg.energy_min_kj, 1):
        return None
    return bucket(min(100, 100 * saved // (used + saved)), cfg.energy_buckets)
