"""The links domain's operator command: ``links`` (rates, traffic classes, levels)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from agent.links.observer import LinksObserver
from agent.links.views import links_table
from harmonaize.opsocket import Command
from harmonaize.schema import to_plain

if TYPE_CHECKING:
    from agent.observations import Observations
    from agent.observers.base import ObserverSet
    from agent.step import HealthStep


class Shell(Protocol):
    """What the command reads of the daemon: its observers and the latest pass."""

    observers: ObserverSet
    observations: Observations
    last_step: HealthStep | None


def commands(shell: Shell) -> dict[str, Command]:
    return {"links": Command(lambda args: links_view(shell),
                             "link rates, traffic classes and levels")}


def links_view(shell: Shell) -> dict[str, Any]:
    links = shell.observers.get("links")
    record = shell.observers.records.get("links")
    sample, rdma, step = shell.observations.links, shell.observations.rdma, shell.last_step
    levels = {level.name: level for level in step.links.links} if step else {}

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
        "classes": [to_plain(h) for h in step.summary.links] if step else [],
    }
