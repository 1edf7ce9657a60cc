"""RDMA observer: InfiniBand/RoCE port counters from sysfs.

NCCL's RDMA traffic bypasses the kernel, so tc and tracepoints never see it;
the NIC's counters do. ``port_xmit_data`` and ``port_rcv_data`` count 4-byte
words. Counters can wrap (32-bit), saturate (legacy PMA counters stick at
2^32-1), reset, or vanish with the device; none of that stops the observer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.observers.base import FeatureAbsent, Observer
from agent.rdma.settings import RdmaSection
from agent.rdma.types import RdmaPortRates, RdmaSample, RdmaTotals

DEFAULT_CLASS = "data"
U32 = 1 << 32
SATURATED_32 = U32 - 1

_RATE = re.compile(r"([\d.]+)\s*Gb/sec")


def counter_delta(previous: int, current: int) -> tuple[int, bool]:
    """Increase of a counter between reads; second value: it is saturated.

    A 32-bit counter that went backwards from its upper half wrapped; anything
    else that went backwards was reset, so only the new value counts.
    """
    if current == SATURATED_32:
        return 0, True
    if current >= previous:
        return current - previous, False
    if U32 // 2 <= previous < U32:
        return current + U32 - previous, False
    return current, False


RETRANSMIT_COUNTERS = ("roce_adp_retrans", "packet_seq_err", "implied_nak_seq_err")
TIMEOUT_COUNTERS = ("local_ack_timeout_err", "roce_adp_retrans_to")
ERROR_COUNTERS = ("symbol_error", "port_rcv_errors", "link_downed", "port_xmit_discards")
#: RdmaTotals field -> the counters it adds up, and the factor to its unit.
TOTALS: dict[str, tuple[tuple[str, ...], int]] = {
    "tx_bytes": (("port_xmit_data",), 4), "rx_bytes": (("port_rcv_data",), 4),
    "tx_packets": (("port_xmit_packets",), 1), "rx_packets": (("port_rcv_packets",), 1),
    "cnp_sent": (("np_cnp_sent",), 1), "cnp_handled": (("rp_cnp_handled",), 1),
    "cnp_ignored": (("rp_cnp_ignored",), 1), "ecn_marked": (("np_ecn_marked_roce_packets",), 1),
    "out_of_sequence": (("out_of_sequence",), 1), "retransmits": (RETRANSMIT_COUNTERS, 1),
    "timeouts": (TIMEOUT_COUNTERS, 1), "errors": (ERROR_COUNTERS, 1),
}


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def read_counters(directory: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        entries = list(directory.iterdir())
    except OSError:
        return out
    for entry in entries:
        text = _read(entry)
        if text is not None and text.isdigit():
            out[entry.name] = int(text)
    return out


@dataclass
class _Port:
    device: str
    port: int
    path: Path
    netdev: str
    link_layer: str


def discover(sys_root: str | Path) -> list[_Port]:
    base = Path(sys_root) / "class" / "infiniband"
    ports = []
    try:
        devices = sorted(base.iterdir())
    except OSError:
        return []
    for device in devices:
        try:
            port_dirs = sorted((device / "ports").iterdir())
        except OSError:
            continue
        for port_dir in port_dirs:
            if not port_dir.name.isdigit():
                continue
            netdev = _read(port_dir / "gid_attrs" / "ndevs" / "0") or ""
            if not netdev:
                try:
                    netdev = next((device / "device" / "net").iterdir()).name
                except (OSError, StopIteration):
                    netdev = ""
            ports.append(_Port(device.name, int(port_dir.name), port_dir, netdev,
                               _read(port_dir / "link_layer") or "unknown"))
    return ports


class RdmaObserver(Observer):
    name = "rdma"

    def __init__(self, cfg: RdmaSection, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.ports: list[_Port] = []
        self._prev: dict[str, dict[str, int]] = {}
        self._prev_at = 0.0
        self._totals: dict[str, dict[str, int]] = {}

    def start(self) -> None:
        self.ports = discover(self.cfg.sysfs_root)
        if not self.ports:
            raise FeatureAbsent("no RDMA devices")
        self._prev = {self._key(p): self._read(p) for p in self.ports}
        self._prev_at = self.clock()

    def describe(self) -> dict[str, Any]:
        return {"detail": f"{len(self.ports)} RDMA port(s)",
                "ports": [f"{p.device}/{p.port}" for p in self.ports]}

    @staticmethod
    def _key(port: _Port) -> str:
        return f"{port.device}/{port.port}"

    @staticmethod
    def _read(port: _Port) -> dict[str, int]:
        counters = read_counters(port.path / "counters")
        counters.update(read_counters(port.path / "hw_counters"))
        return counters

    def sample(self, now: float) -> RdmaSample:
        mono = self.clock()
        dt, self._prev_at = mono - self._prev_at, mono
        rates, missing = [], []
        for port in self.ports:
            key = self._key(port)
            if not port.path.is_dir():
                missing.append(key)
                self._prev.pop(key, None)
                continue
            current = self._read(port)
            previous = self._prev.get(key, current)
            self._prev[key] = current
            rates.append(self._rates(port, current, previous, dt, self._accumulate(
                key, current, previous)))
        return RdmaSample(tuple(rates), tuple(missing))

    def _accumulate(self, key: str, current: dict[str, int],
                    previous: dict[str, int]) -> RdmaTotals:
        totals = self._totals.setdefault(key, dict.fromkeys(TOTALS, 0))
        for field, (names, factor) in TOTALS.items():
            for name in names:
                if name in current:
                    delta, _ = counter_delta(previous.get(name, current[name]), current[name])
                    totals[field] += delta * factor
        return RdmaTotals(**totals)

    def _rates(self, port: _Port, current: dict[str, int], previous: dict[str, int],
               dt: float, totals: RdmaTotals) -> RdmaPortRates:
        saturated: list[str] = []

        def rate(*names: str) -> float:
            total = 0
            for name in names:
                if name not in current:
                    continue
                delta, stuck = counter_delta(previous.get(name, current[name]), current[name])
                if stuck:
                    saturated.append(name)
                total += delta
            return total / dt if dt > 0 else 0.0

        state = _read(port.path / "state") or "unknown"
        rate_text = _read(port.path / "rate") or ""
        match = _RATE.search(rate_text)
        gbps = float(match.group(1)) if match else None
        tx_bps = 32 * rate("port_xmit_data")  # 4-byte words -> bits
        rx_bps = 32 * rate("port_rcv_data")
        link_class = self.cfg.link_classes.get(
            self._key(port), self.cfg.link_classes.get(port.netdev, DEFAULT_CLASS))
        return RdmaPortRates(
            device=port.device,
            port=port.port,
            netdev=port.netdev,
            link_class=link_class,
            link_layer=port.link_layer,
            state=state.split(":", 1)[-1].strip() if ":" in state else state,
            up="ACTIVE" in state,
            rate_gbps=gbps,
            tx_bps=tx_bps,
            rx_bps=rx_bps,
            tx_pps=rate("port_xmit_packets"),
            rx_pps=rate("port_rcv_packets"),
            tx_utilization=min(1.0, tx_bps / (gbps * 1e9)) if gbps else None,
            rx_utilization=min(1.0, rx_bps / (gbps * 1e9)) if gbps else None,
            cnp_sent_per_s=rate("np_cnp_sent"),
            cnp_handled_per_s=rate("rp_cnp_handled"),
            ecn_marked_per_s=rate("np_ecn_marked_roce_packets"),
            out_of_sequence_per_s=rate("out_of_sequence"),
            retransmits_per_s=rate(*RETRANSMIT_COUNTERS, *TIMEOUT_COUNTERS),
            errors_per_s=rate(*ERROR_COUNTERS),
            saturated=tuple(sorted(set(saturated))),
            totals=totals,
        )
