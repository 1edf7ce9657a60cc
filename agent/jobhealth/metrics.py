"""Job health's metrics: findings standing now and found since the start, by finding
and cause (fixed sets: no job, rank or communicator is a label)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from harmonaize.messages.jobhealth import Cause, Finding
from harmonaize.metrics import Family, counter, gauge

if TYPE_CHECKING:
    from agent.jobhealth.service import JobHealthService

FINDINGS = (Finding.HANG, Finding.STALL, Finding.STRAGGLER)


def families(prefix: str, service: JobHealthService | None) -> list[Family]:
    standing = gauge(f"{prefix}_job_findings", "Communicators with a finding now, from the "
                     "host's own ranks, by finding and cause.")
    found = counter(f"{prefix}_job_findings_total", "Findings made since the agent started, "
                    "by finding and cause.")
    uncounted = counter(f"{prefix}_job_ranks_uncounted_total", "Processes whose stats the "
                        "kernel did not tie to their job (not counted).")
    if service is not None:
        now: Counter[tuple[str, str]] = Counter(
            (v.finding.value, v.cause.value) for v in service.engine.judge.verdicts().values())
        for finding in FINDINGS:
            for cause in Cause:
                key = (finding.value, cause.value)
                standing.add(now.get(key, 0), finding=key[0], cause=key[1])
                found.add(service.engine.found.get(key, 0), finding=key[0], cause=key[1])
        uncounted.add(service.uncounted)
    return [standing, found, uncounted]
