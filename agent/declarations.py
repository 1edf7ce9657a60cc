"""What tenants declared for their jobs on this host, newest revision first.

Declarations come from the controller (or an operator's ``declare``); the
tuning service takes every one, and validation asks how long a job may be
paused. Pure bookkeeping: no I/O, no clock.
"""

from __future__ import annotations

import logging

from harmonaize.messages import JobDeclaration

log = logging.getLogger("harmonaize.agent")


class Declarations:
    def __init__(self) -> None:
        self.jobs: dict[str, JobDeclaration] = {}

    def receive(self, declaration: JobDeclaration) -> None:
        """A declaration or its withdrawal; an older revision than the one held (resent
        after a reconnect) leaves the newer standing."""
        if declaration.withdrawn:
            if self.jobs.pop(declaration.job, None) is not None:
                log.info("job %s: declaration withdrawn", declaration.job)
            return
        known = self.jobs.get(declaration.job)
        if known is not None and known.revision > declaration.revision:
            return
        self.jobs[declaration.job] = declaration
        log.info("job %s declares (revision %d): validation pauses up to %g s, %d tuning "
                 "ranges, %s for energy", declaration.job, declaration.revision,
                 declaration.max_validation_pause, len(declaration.tuning),
                 f"{declaration.energy.max_slowdown:.1%} slowdown"
                 if declaration.energy else "no slowdown")

    def pause_allowance(self, job: str) -> float:
        """Seconds the job accepts its GPUs paused for a validation (0 undeclared)."""
        declaration = self.jobs.get(job)
        return declaration.max_validation_pause if declaration else 0.0

    def defer_allowance(self, job: str) -> float:
        """Seconds by which the job may defer a validation notice, once (0 undeclared)."""
        declaration = self.jobs.get(job)
        return declaration.max_validation_defer if declaration else 0.0

    def negotiates(self, job: str) -> bool:
        """Whether the job asks for maintenance windows it can negotiate: its declaration
        (from the controller, or an operator's) gives its checkpoint cadence."""
        declaration = self.jobs.get(job)
        return declaration is not None and declaration.checkpoint_every > 0
