"""The links domain's metrics: per link as node_exporter names them, and the eBPF programs.

Counters are cumulative since the observer started on the link (``_total``,
base units), labelled ``device`` (the interface), ``direction`` (``receive``,
``transmit``) and, per traffic class, ``class`` (``0``..``7``): the same
numbers ``harmonctl links --json`` shows under ``totals``. Gauges are the
last interval's (utilization) or the held level (congestion).
"""

from __future__ import annotations

from agent.links.health import LinkLevels
from agent.links.observer import LinksObserver
from agent.links.types import LinkSample
from agent.observers.base import ObserverSet
from harmonaize.metrics import Family, counter, gauge

DIRECTIONS = (("receive", "rx"), ("transmit", "tx"))


def families(prefix: str, observers: ObserverSet, sample: LinkSample | None = None,
             levels: tuple[LinkLevels, ...] = ()) -> list[Family]:
    attached = gauge(f"{prefix}_bpf_programs_attached",
                     "eBPF programs attached, by hook (tc: two per watched link).")
    links = observers.get("links")
    datapath = links.datapath if isinstance(links, LinksObserver) else None
    tc = 2 * len(datapath.attached) if datapath is not None else 0
    tracepoints = int(datapath.has_retransmits) + int(datapath.has_drops) if datapath else 0
    out = [attached.add(tc, hook="tc").add(tracepoints, hook="tracepoint")]
    out += per_link(prefix, sample, levels)
    kernel = counter(f"{prefix}_kernel_drops_total",
                     "Packets the kernel dropped on this host, by drop reason (eBPF "
                     "tracepoint; every network namespace).")
    if isinstance(links, LinksObserver):
        for reason, counts in links.drops_by_reason().items():
            kernel.add(counts["total"], reason=reason)
    return [*out, kernel]


def per_link(prefix: str, sample: LinkSample | None,
             levels: tuple[LinkLevels, ...] = ()) -> list[Family]:
    p = f"{prefix}_link"
    up = gauge(f"{p}_up", "Whether the link is up (operational state up or unknown).")
    speed = gauge(f"{p}_speed_bytes", "Link speed in bytes per second (configured or "
                  "from sysfs; absent when unknown).")
    utilization = gauge(f"{p}_utilization_ratio",
                        "Share of the link's speed used over the last sampling interval.")
    congestion = gauge(f"{p}_congestion_level",
                       "Held congestion level: 0 none, 1 low, 2 high.")
    nbytes = counter(f"{p}_bytes_total", "Bytes on the wire, L2 headers included; "
                     "transmit is what left the interface, after its root qdisc.")
    packets = counter(f"{p}_packets_total", "Packets; a GSO packet counts as its segments.")
    class_bytes = counter(f"{p}_class_bytes_total",
                          "Bytes per traffic class (DSCP mapped to 0-7; eBPF only); transmit "
                          "as offered to the root qdisc.")
    ect = counter(f"{p}_ecn_capable_packets_total", "ECN-capable packets (ECT or CE).")
    ce = counter(f"{p}_ce_marked_packets_total", "Packets marked Congestion Experienced.")
    retransmits = counter(f"{p}_retransmitted_segments_total",
                          "TCP segments retransmitted through this link (the host's "
                          "retransmissions attributed by route).")
    drops = counter(f"{p}_drops_total",
                    "Packets dropped on this link by where: source nic (the driver's own, per "
                    "direction), qdisc (the root qdisc, transmit), tc (filters on either "
                    "hook, direction any).")
    errors = counter(f"{p}_errors_total", "The NIC's own error counts.")
    held = {level.name: level for level in levels}
    for link in sample.links if sample is not None else ():
        device = link.name
        totals = link.totals
        up.add(link.up, device=device)
        speed.add(link.speed_mbps * 125_000 if link.speed_mbps else None, device=device)
        if device in held:
            congestion.add(held[device].congestion.rank, device=device)
        for direction, short in DIRECTIONS:
            utilization.add(getattr(link, f"{short}_utilization"), device=device,
                            direction=direction)
            nbytes.add(getattr(totals, f"{short}_bytes"), device=device, direction=direction)
            packets.add(getattr(totals, f"{short}_packets"), device=device,
                        direction=direction)
            ect.add(getattr(totals, f"{short}_ect"), device=device, direction=direction)
            ce.add(getattr(totals, f"{short}_ce"), device=device, direction=direction)
            drops.add(getattr(totals, f"nic_{short}_drops"), device=device,
                      direction=direction, source="nic")
            errors.add(getattr(totals, f"{short}_errors"), device=device, direction=direction)
        for cls in link.classes:
            class_bytes.add(cls.rx_bytes_total, device=device, direction="receive",
                            **{"class": str(cls.cls)})
            class_bytes.add(cls.tx_bytes_total, device=device, direction="transmit",
                            **{"class": str(cls.cls)})
        drops.add(totals.qdisc_drops, device=device, direction="transmit", source="qdisc")
        drops.add(totals.tc_drops, device=device, direction="any", source="tc")
        retransmits.add(totals.retransmits, device=device)
    return [up, speed, utilization, congestion, nbytes, packets, class_bytes, ect, ce,
            retransmits, drops, errors]
