"""What the job-health domain offers the other domains: the vocabulary of what it
reports (no other domain uses more of it; the daemon wires the service)."""

from __future__ import annotations

from harmonaize.messages.jobhealth import Cause, Finding, JobRankProgress, ProcessState

__all__ = ["Cause", "Finding", "JobRankProgress", "ProcessState"]
