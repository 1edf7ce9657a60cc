"""Tenants' declarations: which one is in force for a job, and which may replace it.

Sans-I/O. A tenant declares what the provider may do to one of its own jobs; the
core forwards the declaration to the job's hosts with the job's Unix group from
the placement (never from the tenant), and stores it with the batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from controller.types import Placement
from harmonaize.messages import ErrorCode, JobDeclaration


def for_host(declaration: JobDeclaration, placement: Placement | None) -> JobDeclaration:
    """What a host gets: the tenant's declaration plus the job's Unix group there."""
    return dataclasses.replace(declaration, group=placement.group if placement else "")


class Declarations:
    def __init__(self, restored: Iterable[tuple[str, JobDeclaration]] = ()) -> None:
        #: By job: (tenant, declaration).
        self.by_job: dict[str, tuple[str, JobDeclaration]] = {d.job: (t, d) for t, d in restored}
        self._dirty: dict[str, tuple[str, JobDeclaration] | None] = {}

    def get(self, job: str) -> tuple[str, JobDeclaration] | None:
        return self.by_job.get(job)

    def refusal(self, tenant: str, declaration: JobDeclaration,
                placement: Placement | None) -> tuple[ErrorCode, str] | None:
        """Why the tenant's declaration is refused (a code and its answer); None if taken."""
        if not tenant:
            return (ErrorCode.NOT_AUTHENTICATED,
                    "not authenticated: declarations need a tenant key")
        if placement is None or placement.tenant != tenant:
            # The same answer for "not yours" and "no such job": no probing for job ids.
            return ErrorCode.NOT_PLACED, f"no job {declaration.job!r} of yours is placed"
        if declaration.group:
            return (ErrorCode.PROVIDER_FIELD,
                    "job-declaration.group: set by the provider's placement, not by a "
                    "tenant")
        current = self.by_job.get(declaration.job)
        if current is not None and declaration.revision < current[1].revision:
            # Agents ignore an older revision too: acknowledging it would say it applies.
            return (ErrorCode.STALE_REVISION,
                    f"revision {declaration.revision} is older than revision "
                    f"{current[1].revision} in force: ignored (declare a higher one)")
        return None

    def put(self, tenant: str, declaration: JobDeclaration) -> None:
        self.by_job[declaration.job] = self._dirty[declaration.job] = (tenant, declaration)

    def remove(self, job: str) -> bool:
        """Forget the job's declaration; whether there was one."""
        if self.by_job.pop(job, None) is None:
            return False
        self._dirty[job] = None
        return True

    def of_tenant(self, tenant: str) -> list[str]:
        return sorted(job for job, (owner, _) in self.by_job.items() if owner == tenant)

    def take_dirty(self) -> dict[str, tuple[str, JobDeclaration] | None]:
        dirty, self._dirty = self._dirty, {}
        return dirty
