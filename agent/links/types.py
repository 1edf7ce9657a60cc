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
class LinkTotals:
    """Cumulative counts since the observer started on the link.

    Transmitted bytes and packets are what left the interface (after the root
    qdisc); ECN counts come from the eBPF counters (zero in proc mode);
    retransmissions are the segments attributed to this link; drops are by
    where they happened: the NIC or driver (``/proc/net/dev``), the root qdisc
    (``tc -s qdisc``: queue full, shaping), and tc filters on either hook (the
    clsact qdisc's drops).
    """

    rx_bytes: int = 0
    tx_bytes: int = 0
    rx_packets: int = 0
    tx_packets: int = 0
    rx_ect: int = 0
    rx_ce: int = 0
    tx_ect: int = 0
    tx_ce: int = 0
    retransmits: int = 0
    nic_rx_drops: int = 0
    nic_tx_drops: int = 0
    qdisc_drops: int = 0
    tc_drops: int = 0
    rx_errors: int = 0
    tx_errors: int = 0

    @property
    def drops(self) -> int:
        return self.nic_rx_drops + self.nic_tx_drops + self.qdisc_drops + self.tc_drops


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
    #: The NIC's (driver's) own drops, both directions: what link health judges as loss.
    drops_per_s: float
    errors_per_s: float
    classes: tuple[ClassRates, ...] = ()
    totals: LinkTotals = LinkTotals()
    #: Retransmitted segments per packet sent, over the retransmissions' own span.
    retransmit_fraction: float = 0.0
    #: Packets the root qdisc dropped, and tc filters shot (either hook), per second.
    qdisc_drops_per_s: float = 0.0
    tc_drops_per_s: float = 0.0

    @property
    def all_drops_per_s(self) -> float:
        """Every drop on this link, wherever it happened."""
        return self.drops_per_s + self.qdisc_drops_per_s + self.tc_drops_per_s

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
