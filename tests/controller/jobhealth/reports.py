"""Ranks' progress as agents report it, for the controller's job-health tests."""

from __future__ import annotations

from harmonaize.messages import JobRankProgress
from harmonaize.messages.jobhealth import (
    Cause,
    CommProgress,
    Finding,
    ProcessState,
    RankProgress,
)

COMM = 7


def rank(name: str, collectives: int, process: ProcessState = ProcessState.RUNNING,
         cause: Cause = Cause.UNKNOWN) -> RankProgress:
    return RankProgress(name, collectives, process, cause)


def progress(job: str, *ranks: RankProgress, still_for: float = 0.0, n_ranks: int = 4,
             comm: int = COMM, finding: Finding = Finding.MOVING,
             cause: Cause = Cause.UNKNOWN, interval: float = 10.0) -> JobRankProgress:
    """One host's report of one communicator."""
    counts = [r.collectives for r in ranks] or [0]
    return JobRankProgress(job, (CommProgress(
        comm, n_ranks, len(ranks), min(counts), max(counts), still_for, finding, cause,
        tuple(ranks)),), interval)
