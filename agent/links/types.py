"""The links domain's plain data: each interface's rates as one pass saw them.

No I/O here: the link health engine, tuning and the views import this; the
observer (eBPF datapath or /proc counters) fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ClassRates:
    cls: int
    rx_bps: float
    tx_bps: float
    rx_bytes_total: int = 0
    tx_bytes_total: int = 0


@dataclass(frozen=True)
class LinkRates:
    name: str
    link_class: str
    up: bool
    speed_mbps: int | None
    rx_bps: float
    tx_bps: float
    rx_pps: float
    tx_pps: float
    rx_utilization: float | None
    tx_utilization: float | None
    #: Share of received packets that were ECN-capable / CE-marked (eBPF mode only).
    ect_fraction: float
    ce_fraction: float
    retransmits_per_s: float
    drops_per_s: float
    errors_per_s: float
    classes: tuple[ClassRates, ...] = ()
    #: Cumulative counts: since attach in eBPF mode, the interface's own in proc mode.
    totals: tuple[int, int, int, int] = (0, 0, 0, 0)  # rx bytes, tx bytes, rx pkts, tx pkts
    #: Retransmitted segments per packet sent, over the retransmissions' own span.
    retransmit_fraction: float = 0.0

    @property
    def utilization(self) -> float | None:
        """The busier direction, 0..1, or None when the speed is unknown."""
        values = [u for u in (self.rx_utilization, self.tx_utilization) if u is not None]
        return max(values) if values else None


@dataclass(frozen=True)
class LinkSample:
    mode: str
    interval: float
    links: tuple[LinkRates, ...]
    #: Host-wide retransmitted segments per second (all interfaces).
    retransmits_per_s: float
