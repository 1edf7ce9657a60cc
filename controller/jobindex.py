"""Which placed jobs' health may have changed since the redactor last judged it
(controller/redaction.py): those on a host that changed, and those placed or retuned
since. Judging every placed job at each batch cost a pass over all of them; a job
judged anew whose health is unchanged publishes nothing, so judging only these tells
tenants the same. Sans-I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.types import Placement


@dataclass
class JobIndex:
    #: The jobs placed on each host.
    _on: dict[str, set[str]] = field(default_factory=dict)
    #: Each job's place in the order of the redactor's ``placements`` (a dict keeps the
    #: order jobs were first placed in; a job ended and placed again goes last).
    _order: dict[str, int] = field(default_factory=dict)
    _placed: int = 0
    #: Jobs placed (anew or moved) or retuned since the last :meth:`take`.
    _changed: set[str] = field(default_factory=set)

    def place(self, placement: Placement, before: Placement | None) -> None:
        self._unindex(placement.job, before)
        if placement.job not in self._order:
            self._order[placement.job] = self._placed
            self._placed += 1
        for host in placement.hosts:
            self._on.setdefault(host, set()).add(placement.job)
        self._changed.add(placement.job)

    def retuned(self, job: str) -> None:
        self._changed.add(job)

    def remove(self, job: str, before: Placement | None) -> None:
        self._unindex(job, before)
        self._order.pop(job, None)
        self._changed.discard(job)

    def take(self, hosts: Iterable[str], placements: Mapping[str, Placement]) -> list[str]:
        """The placed jobs on these hosts or changed since the last call, in the order
        of ``placements`` (the order a judgement of every job takes, so the feed numbers
        what they publish alike)."""
        affected, self._changed = self._changed, set()
        for host in hosts:
            affected |= self._on.get(host, set())
        return sorted((j for j in affected if j in placements), key=self._order.__getitem__)

    def _unindex(self, job: str, before: Placement | None) -> None:
        for host in before.hosts if before is not None else ():
            jobs = self._on.get(host)
            if jobs is not None:
                jobs.discard(job)
                if not jobs:
                    del self._on[host]
