"""What operators see of job health on this host: each job's communicators, their
counts and finding, and the ranks furthest behind with their pids and process states
(operators may see pids; nothing here reaches a tenant)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent.jobhealth.service import JobHealthService

#: Ranks shown per communicator (the ones at its minimum first).
LAGGARDS = 16


def jobs_view(service: JobHealthService, now: float) -> dict[str, Any]:
    engine = service.engine
    jobs = []
    for name, job in sorted(engine.jobs.items()):
        comms = []
        for comm in sorted(job.comms.values(), key=lambda c: c.comm):
            finding, cause = engine.verdict_of(comm)
            verdict = engine.judge.verdict(comm.job, comm.comm)
            ranks = engine.behind_first(comm)
            low = ranks[0].collectives if ranks else 0
            named = {r.rank for r in verdict.ranks} if verdict else set()
            laggards = [r for r in ranks if r.collectives == low or r.rank in named]
            comms.append({
                "comm": f"{comm.comm:016x}", "n_ranks": comm.n_ranks, "ranks_here": len(ranks),
                "collectives_min": low,
                "collectives_max": ranks[-1].collectives if ranks else 0,
                "still_for": round(max(0.0, now - comm.moved_at), 3),
                "finding": finding.value, "cause": cause.value,
                "at_collective": verdict.at_collective if verdict else None,
                "since": verdict.since if verdict else None,
                # Data links judged to retransmit on a dead path since it went still.
                "dead_paths": list(comm.dead_paths),
                "laggards": [{"rank": r.rank, "pid": r.pid, "process": r.state.value,
                              "cause": r.cause.value, "collectives": r.collectives}
                             for r in laggards[:LAGGARDS]],
            })
        jobs.append({"job": name, "gpu_busy": job.gpu_busy, "gpu_fault": job.gpu_fault,
                     "comms": comms})
    return {
        "enabled": True,
        "hang_after": service.cfg.hang_after, "stall_after": service.cfg.stall_after,
        "network_fault": engine.network,
        "retransmit_window": service.cfg.retransmit_window,
        "retransmit_segments": service.cfg.retransmit_segments,
        "jobs": jobs,
        "uncounted_processes": service.uncounted,
        "ranks_over_cap": service.over_cap,
        "reports": service.reports,
    }
