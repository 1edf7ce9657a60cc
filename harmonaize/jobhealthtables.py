"""``harmonctl job-health``: each job's communicators on this host, their finding and
cause, and the ranks behind (with pid and process state: operators only)."""

from __future__ import annotations

from typing import Any

from harmonaize.tables import table


def render_job_health(result: dict[str, Any]) -> str:
    if not result.get("enabled"):
        return "job health: off (jobhealth.enabled = false)"
    comms, laggards, dead = [], [], set()
    for job in result.get("jobs", []):
        for comm in job.get("comms", []):
            dead.update(comm.get("dead_paths", []))
            comms.append({**comm, "job": job["job"],
                          "counts": f"{comm['collectives_min']}-{comm['collectives_max']}",
                          "ranks": f"{comm['ranks_here']}/{comm['n_ranks']}",
                          "still": f"{comm['still_for']:.1f}s"})
            if comm["finding"] != "moving":
                laggards += [{**r, "job": job["job"], "comm": comm["comm"]}
                             for r in comm.get("laggards", [])]
    if not comms:
        return "job health: no job's ranks are known on this host"
    parts = [table(comms, [
        ("job", "JOB"), ("comm", "COMM"), ("ranks", "RANKS"), ("counts", "COLLECTIVES"),
        ("still", "STILL"), ("finding", "FINDING"), ("cause", "CAUSE"),
        ("at_collective", "AT")])]
    if laggards:
        parts.append(table(laggards, [
            ("job", "JOB"), ("comm", "COMM"), ("rank", "RANK"), ("pid", "PID"),
            ("process", "PROCESS"), ("cause", "CAUSE"), ("collectives", "COLLECTIVES")]))
    extra = [f"{name.replace('_', ' ')} {result[name]}" for name in (
        "uncounted_processes", "ranks_over_cap") if result.get(name)]
    if result.get("network_fault"):
        extra.append("the host's data links are down or erroring")
    if dead:
        extra.append(f"still communicators' data links keep retransmitting (a dead path): "
                     f"{', '.join(sorted(dead))}")
    if extra:
        parts.append("; ".join(extra))
    return "\n\n".join(parts)
