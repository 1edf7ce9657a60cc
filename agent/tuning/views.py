"""The tuning domain's operator views: ``harmonctl jobs`` and ``harmonctl policy``, and the
conditions operators see (ranks that disagree or wait), read from the service's state
(nothing here changes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.conditions import Finding
from agent.links.interface import LinksSection
from agent.plugin.layout import NCCL_CAP_VERSION, StatsSlots
from agent.plugin.shm import launch_path, policy_path
from agent.tuning.loop import TuningLoop
from agent.tuning.policies import CHOICE_NAMES, describe_rule
from harmonaize.messages import Severity
from harmonaize.opsocket import CommandError
from harmonaize.schema import to_plain

if TYPE_CHECKING:
    from agent.tuning.service import TuningService


def declared_job(service: TuningService, job: Any) -> str:
    """The job an operator named, if declared; else one clear line."""
    if not isinstance(job, str) or job not in service.loop.jobs:
        known = ", ".join(sorted(service.loop.jobs)) or "none"
        raise CommandError(f"no declaration for job {job!r:.140} (declared: {known})")
    return job


def jobs_view(service: TuningService, now: float) -> dict[str, Any]:
    """``harmonctl jobs``: every declared job, the link level, the traffic classes."""
    rows = []
    htb = service.shaper.describe() if service.shaper is not None else {}
    for name, job in sorted(service.loop.jobs.items()):
        rows.append({
            "job": name,
            "revision": job.declaration.revision,
            "ranges": len(job.declaration.tuning),
            "choice": job.choice,
            "wanted": CHOICE_NAMES[job.desired_severity],
            "mode": "multi-host" if job.multi else "one host",
            "communicators": len([c for c in job.comms.values() if c.slots]),
            "pending": service.loop.pending_activations(name),
            "bulk_floor_mbps": job.declaration.bulk.floor_mbps
            if job.declaration.bulk else None,
            "reason": job.reason,
            "waiting": job.waiting or ("withdrawn" if job.retiring else ""),
            "diverged": job.diverged,
        })
    return {"jobs": rows, "link_level": service.loop.raw.value,
            "evidence": service.loop.evidence, "policy_dir": str(service.dir),
            "thresholds": {name: getattr(service.links_cfg, name)
                           for name in sorted(LinksSection.LIVE)},
            "traffic_classes": htb, "errors": service.errors, "last_error": service.last_error,
            # Tenants' stats files beyond the caps (ignored), left to later looks, and
            # slots read mid-update, since the start: what a tenant made the agent skip.
            "stats_files": {"ignored": service.reader.totals["excess"],
                            "deferred": service.reader.totals["deferred"],
                            "stale_slots": service.reader.totals["stale"],
                            "malformed": service.reader.totals["malformed"]}}

def policy_view(service: TuningService, args: Mapping[str, Any], now: float) -> dict[str, Any]:
    """``harmonctl policy``: one job's choices, communicators, ranks and history."""
    name = declared_job(service, args.get("job"))
    job = service.loop.jobs[name]
    stats = service.stats.get(name, StatsSlots())
    versions = {s.nccl_version for s in stats}
    return {
        "job": name,
        "declaration": to_plain(job.declaration),
        "fingerprint": job.derivation.fingerprint,
        "choices": [{"name": c.name, "severity": c.severity, "summary": c.summary,
                     "rules": [describe_rule(r) for r in c.rules]}
                    for c in job.derivation.choices],
        "notes": list(job.derivation.notes),
        "choice": job.choice,
        "reason": job.reason,
        "waiting": job.waiting,
        "mode": "multi-host" if job.multi else "one host",
        "decision": job.acked[0] or None,
        "cancelled": job.aborted,
        "unlisted": [f"{c:#018x}" for c in sorted(job.unlisted)],
        "orphaned": [f"{c:#018x}" for c in sorted(job.orphaned)],
        "group": service.groups.get(name),
        "policy_file": str(policy_path(service.dir, name)),
        "policy_id": service.policy_ids.get(name),
        "channels": "capped" if versions and min(versions) >= NCCL_CAP_VERSION else
        "left to NCCL (its release takes any count as the count itself)" if versions else
        "unknown (no rank yet)",
        "communicators": [
            {"comm": f"{c.comm_id:#018x}", "ranks": c.n_ranks, "nodes": c.n_nodes,
             "here": len(c.slots), "collectives": c.collectives,
             "per_second": round(c.rate, 1),
             "at": (e := job.entries.get(c.comm_id)) and e.at,
             "revision": e.revision if e else 0,
             "before": e.before if e else None, "after": e.after if e else "unlisted",
             "pending": bool(e and e.pending),
             "passed": e is None or not e.switches or c.passed(e.at),
             "waiting": c.waiting, "diverged": c.divergence}
            for c in sorted(job.comms.values(), key=lambda c: c.comm_id)],
        "plugin": [{"pid": s.pid, "comm": f"{s.comm_id:#018x}", "collectives": s.collectives,
                    "revision": s.revision, "at": s.at, "pending": s.held.pending,
                    "switches": s.switches, "last_switch": s.last_switch,
                    "waiting_at": s.wait_at if s.waiting else None,
                    "refused": s.refused_revision if s.refused else None,
                    "deferred": s.deferred, "mapped": s.mapped,
                    "fallbacks": s.fallbacks, "nccl": s.nccl_version}
                   for s in stats],
        "malformed_stats_files": stats.malformed,
        "ignored_stats_files": stats.excess,
        "stale_stats_slots": stats.stale,
        "history": [{"time": c.time, "step": c.step, "kind": c.kind, "from": c.before,
                     "to": c.after, "reason": c.reason, "onset_step": c.onset_step,
                     "activations": [[f"{comm:#x}", at] for comm, at in c.activations]}
                    for c in job.history],
        "next_launch": {"file": str(launch_path(service.dir, name)),
                        "values": {k: v for k, (v, _) in
                                   service.recommendations(name).items()}},
        "steps": service.loop.steps,
    }


def findings(loop: TuningLoop) -> list[Finding]:
    """Conditions for operators: ranks that disagree, ranks that wait. INFO: they
    are about a job, not the host's hardware (the host stays healthy)."""
    diverged, paused = [], []
    for name, job in sorted(loop.jobs.items()):
        diverged += [f"job {name} comm {line}" for line in job.diverged]
        for comm in job.comms.values():
            waiting = [s for s in comm.slots if s.waiting]
            if waiting:
                paused.append(f"job {name} comm {comm.comm_id:#x}: {len(waiting)} rank(s) "
                              f"wait at collective {waiting[0].wait_at} for a change to be "
                              "confirmed")
    return [
        Finding("TuningDiverged", bool(diverged), Severity.INFO,
                "RanksDisagree" if diverged else "", "; ".join(diverged)[:1000]),
        Finding("TuningPaused", bool(paused), Severity.INFO,
                "WaitingForConfirmation" if paused else "", "; ".join(paused)[:1000]),
    ]
