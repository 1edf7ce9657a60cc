"""Job health's operator command: ``job-health`` (each job's communicators on this
host, their finding and cause, and the ranks behind with pid and process state)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Protocol

from harmonaize.opsocket import Command

if TYPE_CHECKING:
    from agent.jobhealth.service import JobHealthService


class Shell(Protocol):
    jobhealth: JobHealthService | None


def commands(shell: Shell) -> dict[str, Command]:
    return {
        "job-health": Command(lambda args: job_health_view(shell, args),
                              "jobs' communicators here: counts, still for, finding, cause, "
                              "ranks behind (job)"),
    }


def job_health_view(shell: Shell, args: dict[str, Any]) -> dict[str, Any]:
    if shell.jobhealth is None:
        return {"enabled": False, "jobs": []}
    view = shell.jobhealth.view(time.time())
    job = args.get("job")
    if isinstance(job, str) and job:
        view["jobs"] = [j for j in view["jobs"] if j["job"] == job]
    return view
