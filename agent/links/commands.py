"""The links domain's operator command: ``links`` (rates, traffic classes, levels).

The daemon (the composition layer) hands in what it needs: the observers and, per
call, the latest pass as links sees it (:class:`LinksPass`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.links.health import LinkLevels
from agent.links.observer import LinksObserver
from agent.links.types import LinkSample
from agent.links.views import links_table
from agent.observers.base import ObserverSet
from agent.rdma.interface import RdmaSample
from harmonaize.messages import LinkHealth
from harmonaize.opsocket import Command
from harmonaize.schema import to_plain


@dataclass(frozen=True)
class LinksPass:
    """The latest pass, the part the ``links`` command shows."""

    sample: LinkSample | None
    rdma: RdmaSample | None
    #: Each link's held levels; empty before the first step.
    levels: tuple[LinkLevels, ...] = ()
    #: Per-class health as the summary reports it; None before the first step.
    classes: tuple[LinkHealth, ...] | None = None


def commands(observers: ObserverSet, latest: Callable[[], LinksPass]) -> dict[str, Command]:
    return {"links": Command(lambda args: links_view(observers, latest()),
                             "link rates, traffic classes and levels")}


def links_view(observers: ObserverSet, latest: LinksPass) -> dict[str, Any]:
    links = observers.get("links")
    record = observers.records.get("links")
    sample, rdma = latest.sample, latest.rdma
    levels = {level.name: level for level in latest.levels}

    def with_levels(row: dict[str, Any]) -> dict[str, Any]:
        level = levels.get(row["name"])
        return {**row, "congestion": level.congestion.value if level else None,
                "congestion_now": level.raw_congestion.value if level else None,
                "errors": level.errors.value if level else None}

    running = record is not None and record.state.value == "running"
    return {
        "mode": getattr(links, "mode", None),
        "state": record.state.value if record else "disabled",
        "detail": (record.extra.get("detail") or record.detail) if record else "",
        "links": [with_levels(row) for row in links_table(sample)],
        "rdma": [with_levels({**to_plain(port), "name": port.name})
                 for port in (rdma.ports if rdma is not None else ())],
        "retransmits_per_s": getattr(sample, "retransmits_per_s", None),
        "drops_by_reason": links.drops_by_reason()
        if isinstance(links, LinksObserver) and running else {},
        "classes": [to_plain(h) for h in latest.classes] if latest.classes is not None else [],
    }
