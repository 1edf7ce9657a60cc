"""The links domain's metrics: the eBPF programs attached, by hook."""

from __future__ import annotations

from agent.links.observer import LinksObserver
from agent.observers.base import ObserverSet
from harmonaize.metrics import Family, gauge


def families(prefix: str, observers: ObserverSet) -> list[Family]:
    attached = gauge(f"{prefix}_bpf_programs_attached",
                     "eBPF programs attached, by hook (tc: two per watched link).")
    links = observers.get("links")
    datapath = links.datapath if isinstance(links, LinksObserver) else None
    tc = 2 * len(datapath.attached) if datapath is not None else 0
    tracepoints = int(datapath.has_retransmits) + int(datapath.has_drops) if datapath else 0
    return [attached.add(tc, hook="tc").add(tracepoints, hook="tracepoint")]
