"""The RDMA domain's plain data: each InfiniBand/RoCE port's rates as one pass saw them.

No I/O here: the link health engine and the views import this; the observer
(sysfs counters) fills it in.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RdmaTotals:
    """A port's counters, cumulative since the observer started (wraps and resets of the
    NIC's own counters taken care of). Bytes, not the 4-byte words sysfs counts."""

    tx_bytes: int = 0
    rx_bytes: int = 0
    tx_packets: int = 0
    rx_packets: int = 0
    #: CNPs sent as a receiver that saw ECN marks (notification point).
    cnp_sent: int = 0
    #: CNPs acted on as a sender (reaction point), and ones ignored (its reaction point
    #: was off for the priority).
    cnp_handled: int = 0
    cnp_ignored: int = 0
    ecn_marked: int = 0
    out_of_sequence: int = 0
    #: Retransmissions (adaptive, after NAKs) and retransmission timeouts.
    retransmits: int = 0
    timeouts: int = 0
    errors: int = 0


@dataclass(frozen=True)
class RdmaPortRates:
    device: str
    port: int
    netdev: str
    link_class: str
    link_layer: str
    state: str
    up: bool
    rate_gbps: float | None
    tx_bps: float
    rx_bps: float
    tx_pps: float
    rx_pps: float
    tx_utilization: float | None
    rx_utilization: float | None
    #: CNPs this port sent as a receiver seeing ECN marks / handled as a throttled sender.
    cnp_sent_per_s: float
    cnp_handled_per_s: float
    ecn_marked_per_s: float
    out_of_sequence_per_s: float
    retransmits_per_s: float
    errors_per_s: float
    saturated: tuple[str, ...] = ()
    totals: RdmaTotals = RdmaTotals()

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    @property
    def utilization(self) -> float | None:
        values = [u for u in (self.rx_utilization, self.tx_utilization) if u is not None]
        return max(values) if values else None

    @property
    def congestion_fraction(self) -> float:
        """CNPs handled per packet sent, or ECN marks per packet received: the worse."""
        handled = self.cnp_handled_per_s / self.tx_pps if self.tx_pps else 0.0
        marked = self.ecn_marked_per_s / self.rx_pps if self.rx_pps else 0.0
        return max(handled, marked)


@dataclass(frozen=True)
class RdmaSample:
    ports: tuple[RdmaPortRates, ...]
    #: Ports that were there at start and are gone now.
    missing: tuple[str, ...] = ()
