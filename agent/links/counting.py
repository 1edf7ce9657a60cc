"""The link observer's arithmetic: counts into rates and totals that mean what they say.

Pure functions and small ledgers, no I/O: the observer reads the eBPF maps,
``/proc/net/dev`` and the qdisc counters, and hands the numbers here.

* Egress: our tc program counts at clsact egress, before the root qdisc.
  :class:`EgressLedger` subtracts what the root qdisc has not passed on
  (dropped, still queued, or shot by a later tc filter), so transmitted bytes
  and packets are what left the interface, in the same units (a GSO packet as
  its segments and their headers, as ``qdisc_pkt_len`` counts them).
* Totals: every counter is cumulative since the observer started (an operator
  can reconcile any window), beside the rates of the last interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.kernel.qdisc import PASS_THROUGH, InterfaceQdiscs, QdiscCounters
from agent.kernel.sysfs import DevCounters
from agent.links.datapath import BYTES, CE, CLASSES, ECT, EGRESS, INGRESS, PACKETS, Counters
from agent.links.types import ClassRates, LinkTotals

U32 = 1 << 32


def delta(current: int, previous: int) -> int:
    """Counter difference; a counter that went backwards was reset (or evicted)."""
    return current - previous if current >= previous else current


def rate(current: int, previous: int, dt: float) -> float:
    return delta(current, previous) / dt if dt > 0 else 0.0


def delta32(current: int, previous: int) -> int:
    """Difference of a counter the kernel keeps in 32 bits (qdisc drops, packets)."""
    return (current - previous) % U32


@dataclass
class Accumulator:
    """A cumulative count since the first reading of a counter that may reset."""

    total: int = 0
    _last: int | None = None

    def add(self, current: int, *, width32: bool = False) -> int:
        if self._last is not None:
            if width32:
                self.total += delta32(current, self._last)
            else:
                self.total += delta(current, self._last)
        self._last = current
        return self.total

    def rebase(self) -> None:
        """The counter was replaced (a new qdisc): its next reading is a new baseline."""
        self._last = None


@dataclass
class EgressLedger:
    """What a link's root qdisc has not passed on, of what our egress counter saw.

    ``offered`` is our clsact egress count (before the qdisc), ``sent`` the root
    qdisc's "Sent" counter. Between two readings of the same qdisc, offered minus
    sent grew by what was dropped, queued or shot by a later tc filter: that is
    held back, and transmitted = offered - held. When the root qdisc changes
    (replaced, or counters reset) the held amount so far is kept and a new
    baseline taken. A root that queues nothing (``noqueue``, or none) passes
    everything on.
    """

    held_bytes: int = 0
    held_packets: int = 0
    #: Share of what was offered that the qdisc passed on over the last reading's span,
    #: applied to the rates between two readings.
    byte_share: float = 1.0
    packet_share: float = 1.0
    _key: tuple[str, int] | None = None
    _base: tuple[int, int, int, int] = (0, 0, 0, 0)  # offered bytes, packets; sent bytes, packets
    _held_base: tuple[int, int] = (0, 0)
    _last: tuple[int, int, int, int] | None = None
    _sent: tuple[Accumulator, Accumulator] | None = None

    def update(self, offered_bytes: int, offered_packets: int,
               root: QdiscCounters | None) -> None:
        if root is None or root.kind in PASS_THROUGH:
            self._held_base = (self.held_bytes, self.held_packets)
            self._key, self._last, self._sent = None, None, None
            self.byte_share = self.packet_share = 1.0
            return
        key = (root.kind, root.handle)
        fresh = self._key != key or self._sent is None
        if not fresh:
            assert self._sent is not None and self._last is not None
            # A qdisc's counters never go backwards while it lives: if they did, it is a
            # new one under the same handle.
            fresh = root.bytes < self._last[2]
        if fresh:
            self._key = key
            self._held_base = (self.held_bytes, self.held_packets)
            self._sent = (Accumulator(), Accumulator())
            self._sent[0].add(root.bytes)
            self._sent[1].add(root.packets, width32=True)
            self._base = (offered_bytes, offered_packets, 0, 0)
            self._last = (offered_bytes, offered_packets, 0, 0)
            return
        assert self._sent is not None and self._last is not None
        sent_bytes = self._sent[0].add(root.bytes)
        sent_packets = self._sent[1].add(root.packets, width32=True)
        self.held_bytes = self._held_base[0] + max(
            0, (offered_bytes - self._base[0]) - sent_bytes)
        self.held_packets = self._held_base[1] + max(
            0, (offered_packets - self._base[1]) - sent_packets)
        offered_step = (offered_bytes - self._last[0], offered_packets - self._last[1])
        sent_step = (sent_bytes - self._last[2], sent_packets - self._last[3])
        self.byte_share = _share(sent_step[0], offered_step[0])
        self.packet_share = _share(sent_step[1], offered_step[1])
        self._last = (offered_bytes, offered_packets, sent_bytes, sent_packets)


def _per_s(before: tuple[float, int, int] | None,
           now: tuple[float, int, int]) -> tuple[float, float] | None:
    if before is None or now[0] <= before[0]:
        return None
    span = now[0] - before[0]
    return (now[1] - before[1]) / span, (now[2] - before[2]) / span


def _share(passed: int, offered: int) -> float:
    if offered <= 0:
        return 1.0
    return min(1.0, max(0.0, passed / offered))


@dataclass(frozen=True)
class Traffic:
    """One interval's rates and the cumulative counts behind them."""

    rx_bps: float = 0.0
    tx_bps: float = 0.0
    rx_pps: float = 0.0
    tx_pps: float = 0.0
    ect_fraction: float = 0.0
    ce_fraction: float = 0.0
    classes: tuple[ClassRates, ...] = ()
    rx_bytes: int = 0
    tx_bytes: int = 0
    rx_packets: int = 0
    tx_packets: int = 0
    ecn: tuple[int, int, int, int] = (0, 0, 0, 0)  # rx ECT, rx CE, tx ECT, tx CE


def dev_traffic(now: DevCounters | None, before: DevCounters | None, dt: float,
                base: DevCounters | None) -> Traffic:
    """From /proc/net/dev (what the driver counted: already after the qdisc)."""
    if now is None or before is None:
        return Traffic()
    base = base or now
    return Traffic(
        rx_bps=8 * rate(now.rx_bytes, before.rx_bytes, dt),
        tx_bps=8 * rate(now.tx_bytes, before.tx_bytes, dt),
        rx_pps=rate(now.rx_packets, before.rx_packets, dt),
        tx_pps=rate(now.tx_packets, before.tx_packets, dt),
        rx_bytes=delta(now.rx_bytes, base.rx_bytes),
        tx_bytes=delta(now.tx_bytes, base.tx_bytes),
        rx_packets=delta(now.rx_packets, base.rx_packets),
        tx_packets=delta(now.tx_packets, base.tx_packets),
    )


def bpf_traffic(now: Counters, before: Counters, dt: float, egress: EgressLedger) -> Traffic:
    """From our tc counters (since attach), transmit corrected by the egress ledger."""
    def per_s(direction: int, field: int, cls: int | None = None) -> float:
        if cls is None:
            return rate(now.total(direction, field), before.total(direction, field), dt)
        return rate(now.get(direction, cls, field), before.get(direction, cls, field), dt)

    rx_pps = per_s(INGRESS, PACKETS)
    return Traffic(
        rx_bps=8 * per_s(INGRESS, BYTES),
        tx_bps=8 * per_s(EGRESS, BYTES) * egress.byte_share,
        rx_pps=rx_pps,
        tx_pps=per_s(EGRESS, PACKETS) * egress.packet_share,
        ect_fraction=per_s(INGRESS, ECT) / rx_pps if rx_pps else 0.0,
        ce_fraction=per_s(INGRESS, CE) / rx_pps if rx_pps else 0.0,
        # Per class, transmit is what was offered to the qdisc: which class's packets
        # the qdisc dropped is not known here.
        classes=tuple(
            ClassRates(cls, 8 * per_s(INGRESS, BYTES, cls), 8 * per_s(EGRESS, BYTES, cls),
                       now.get(INGRESS, cls, BYTES), now.get(EGRESS, cls, BYTES))
            for cls in range(CLASSES)
            if now.get(INGRESS, cls, PACKETS) or now.get(EGRESS, cls, PACKETS)
        ),
        rx_bytes=now.total(INGRESS, BYTES),
        tx_bytes=max(0, now.total(EGRESS, BYTES) - egress.held_bytes),
        rx_packets=now.total(INGRESS, PACKETS),
        tx_packets=max(0, now.total(EGRESS, PACKETS) - egress.held_packets),
        ecn=(now.total(INGRESS, ECT), now.total(INGRESS, CE), now.total(EGRESS, ECT),
             now.total(EGRESS, CE)),
    )


class LinkAccount:
    """One link's cumulative counts since the observer started, and its egress ledger."""

    def __init__(self) -> None:
        self.egress = EgressLedger()
        self.dev_base: DevCounters | None = None
        self.nic = {name: Accumulator() for name in (
            "rx_drops", "tx_drops", "rx_errors", "tx_errors")}
        self.qdisc_drops = Accumulator()
        self.tc_drops = Accumulator()
        self.retransmits = 0.0
        self._root_key: tuple[str, int] | None = None
        #: Per second over each source's last span between two reads: NIC drops, NIC
        #: errors (from /proc/net/dev), qdisc drops, tc drops (from the qdisc counters).
        self._rates = (0.0, 0.0, 0.0, 0.0)
        self._nic: tuple[float, int, int] | None = None  # read at, drops, errors
        self._qdisc: tuple[float, int, int] | None = None  # read at, qdisc drops, tc drops

    def fold(self, at: float, dev: DevCounters | None, qdiscs: InterfaceQdiscs | None) -> None:
        """A fresh read of the NIC's counters (``dev``) and/or the qdiscs' (``qdiscs``;
        None: not re-read this time), made at ``at``."""
        nic_rates, qdisc_rates = self._rates[:2], self._rates[2:]
        if dev is not None:
            if self.dev_base is None:
                self.dev_base = dev
            for name, accumulator in self.nic.items():
                accumulator.add(getattr(dev, name))
            now = (at, self.nic["rx_drops"].total + self.nic["tx_drops"].total,
                   self.nic["rx_errors"].total + self.nic["tx_errors"].total)
            nic_rates = _per_s(self._nic, now) or nic_rates
            self._nic = now
        if qdiscs is not None:
            root = qdiscs.root
            key = (root.kind, root.handle) if root is not None else None
            if key != self._root_key:  # another root qdisc: its counters start anew
                self.qdisc_drops.rebase()
                self._root_key = key
            if root is not None:
                self.qdisc_drops.add(root.drops, width32=True)
            if qdiscs.clsact is not None:
                self.tc_drops.add(qdiscs.clsact.drops, width32=True)
            else:
                self.tc_drops.rebase()
            now = (at, self.qdisc_drops.total, self.tc_drops.total)
            qdisc_rates = _per_s(self._qdisc, now) or qdisc_rates
            self._qdisc = now
        self._rates = (*nic_rates, *qdisc_rates)

    def rates(self) -> tuple[float, float, float, float]:
        """NIC drops, NIC errors, qdisc drops and tc drops per second, each over its
        source's last span between two reads."""
        return self._rates  # type: ignore[return-value]

    def totals(self, traffic: Traffic) -> LinkTotals:
        return LinkTotals(
            rx_bytes=traffic.rx_bytes, tx_bytes=traffic.tx_bytes,
            rx_packets=traffic.rx_packets, tx_packets=traffic.tx_packets,
            rx_ect=traffic.ecn[0], rx_ce=traffic.ecn[1], tx_ect=traffic.ecn[2],
            tx_ce=traffic.ecn[3], retransmits=round(self.retransmits),
            nic_rx_drops=self.nic["rx_drops"].total, nic_tx_drops=self.nic["tx_drops"].total,
            qdisc_drops=self.qdisc_drops.total, tc_drops=self.tc_drops.total,
            rx_errors=self.nic["rx_errors"].total, tx_errors=self.nic["tx_errors"].total,
        )
