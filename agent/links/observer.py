"""Link observer: how full each NIC is, per traffic class, and whether it is congested.

With eBPF (the default where it works) per-interface, per-direction,
per-DSCP-class bytes and packets and ECN marks come from tc clsact counters,
and retransmissions and drops from tracepoints. Without it (no bcc, no
kernel headers, no tracefs, or ``mode = "proc"``) the same rates come from
``/proc/net/dev`` and ``/proc/net/snmp``, without classes or per-link ECN,
and the observer's detail line says why.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agent.kernel import sysfs
from agent.kernel.bpfprobe import BpfUnavailable
from agent.kernel.qdisc import InterfaceQdiscs, QdiscReader
from agent.kernel.routes import RouteCache
from agent.kernel.sysfs import DevCounters, NetDevice
from agent.links.counting import LinkAccount, bpf_traffic, dev_traffic, rate
from agent.links.datapath import (
    BYTES,
    EGRESS,
    PACKETS,
    Counters,
    LinkDatapath,
    dscp_map,
)
from agent.links.settings import LinkMode, LinksSection
from agent.links.types import LinkRates, LinkSample
from agent.observers.base import FeatureAbsent, Observer

log = logging.getLogger(__name__)

DEFAULT_CLASS = "data"
#: In eBPF mode, /proc/net/dev (drops, errors) and /proc/net/snmp (retransmitted
#: segments) are re-read this often (seconds).
DEV_PERIOD = 1.0
#: Operational state is read at most this often (seconds): it rarely changes, and
#: reading it per interface every interval costs more than the counters do.
STATE_PERIOD = 1.0
#: Kernel drops by reason are read this often (seconds), whoever asks: walking the
#: host-wide drop map is a diagnosis, not a health signal.
DROPS_PERIOD = 5.0


def select(devices: Iterable[NetDevice], cfg: LinksSection) -> list[NetDevice]:
    """Which interfaces to watch: include globs, else physical/RDMA NICs; minus excludes."""
    chosen = []
    for device in devices:
        if device.name == "lo" or any(fnmatch.fnmatch(device.name, g) for g in cfg.exclude):
            continue
        if cfg.include:
            wanted = any(fnmatch.fnmatch(device.name, g) for g in cfg.include)
        else:
            wanted = device.physical or device.rdma or cfg.include_virtual
        if wanted:
            chosen.append(device)
    return chosen


def _utilization(bps: float, speed_mbps: int | None) -> float | None:
    if not speed_mbps:
        return None
    return min(1.0, bps / (speed_mbps * 1e6))


class LinksObserver(Observer):
    name = "links"

    def __init__(self, cfg: LinksSection, clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock
        self.devices: list[NetDevice] = []
        self.mode = "proc"
        self.detail = ""
        self.datapath: LinkDatapath | None = None
        self.routes = RouteCache()
        self._speeds: dict[str, int | None] = {}
        self._speeds_at = 0.0
        self._states: dict[str, str] = {}
        self._states_at = 0.0
        self._operstate: dict[str, sysfs.ProcFile] = {}
        #: Kernel drops by reason: counts at the last two reads, and when they were read.
        self._drops: tuple[dict[int, int], dict[int, int], float, float] | None = None
        self._drops_at: float | None = None
        self._accounts: dict[str, LinkAccount] = {}
        self._qdisc = QdiscReader()
        self._qdisc_error = ""
        self._last_retx: tuple[dict[int, float], float] = ({}, 0.0)
        self._retx_base: dict[str, tuple[float, int]] = {}
        self._last: LinkSample | None = None
        self._retx_share: dict[str, float] = {}
        self._net_dev = sysfs.ProcFile(cfg.procfs_root, "net", "dev")
        self._snmp = sysfs.ProcFile(cfg.procfs_root, "net", "snmp")
        self._prev: dict[str, Any] | None = None
        self._prev_at = 0.0

    # --- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        self.devices = select(sysfs.list_devices(self.cfg.sysfs_root), self.cfg)
        if not self.devices:
            raise FeatureAbsent("no interfaces to watch (see observers.links.include)")
        self._refresh_speeds(self.clock())
        self._refresh_states(self.clock())
        if self.cfg.mode is LinkMode.PROC:
            self._fallback("/proc counters by configuration")
        else:
            try:
                self.datapath = self._load_datapath()
            except BpfUnavailable as exc:
                if self.cfg.mode is LinkMode.EBPF:
                    raise RuntimeError(f"eBPF required but unavailable: {exc}") from None
                self._fallback(str(exc))
            else:
                self.mode = "ebpf"
                self.detail = (
                    f"eBPF on {len(self.devices)} interface(s); {self.datapath.events_detail}"
                )
        self._accounts = {d.name: LinkAccount() for d in self.devices}
        self._prev_at = self.clock()
        self._prev = self._read()
        self._account(self._prev, None)
        self._read_drops(self._prev_at)  # the baseline drop rates are measured from

    def _load_datapath(self) -> LinkDatapath:
        classes = {int(k): v for k, v in self.cfg.dscp_classes.items()}
        datapath = LinkDatapath(
            Path(self.cfg.bpf_dir) if self.cfg.bpf_dir else None,
            dscp_classes=dscp_map(classes),
            prefix_v4=self.cfg.retransmit_prefix_v4,
            prefix_v6=self.cfg.retransmit_prefix_v6,
            tracepoints=self.cfg.tracepoints,
        )
        try:
            datapath.load(self.devices)
            datapath.attach()
        except BpfUnavailable:
            datapath.close()
            raise
        except Exception as exc:
            datapath.close()
            raise BpfUnavailable(f"attaching to the interfaces failed: {exc}") from None
        return datapath

    def _fallback(self, reason: str) -> None:
        self.mode = "proc"
        self.detail = f"proc fallback: {reason}"
        log.warning("links: %s", self.detail)

    def stop(self) -> None:
        if self.datapath is not None:
            self.datapath.close()
            self.datapath = None
        self.routes.close()
        self._qdisc.close()
        self._net_dev.close()
        self._snmp.close()
        for handle in self._operstate.values():
            handle.close()
        self._operstate.clear()

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"detail": self.detail, "mode": self.mode,
                               "interfaces": [d.name for d in self.devices]}
        if self._qdisc_error:
            out["qdisc_error"] = self._qdisc_error
        return out

    # --- sampling -------------------------------------------------------------------

    def _refresh_states(self, now: float) -> None:
        # Kept open and re-read from offset 0, like /proc: sysfs regenerates the
        # attribute, and a vanished interface reads as empty until it is back.
        for device in self.devices:
            handle = self._operstate.get(device.name)
            if handle is None:
                handle = self._operstate[device.name] = sysfs.ProcFile(
                    self.cfg.sysfs_root, "class", "net", device.name, "operstate")
            self._states[device.name] = handle.read().strip() or "absent"
        self._states_at = now

    def _refresh_speeds(self, now: float) -> None:
        for device in self.devices:
            self._speeds[device.name] = self.cfg.speeds.get(device.name) or sysfs.read_speed(
                self.cfg.sysfs_root, device.name)
        self._speeds_at = now

    def _read(self) -> dict[str, Any]:
        previous = self._prev or {}
        now = self.clock()
        # With eBPF the NIC's own counters only give drop and error rates: once a
        # second is plenty. Without eBPF they are the traffic counters themselves.
        if self.datapath is None or not previous or now - previous["dev_at"] >= DEV_PERIOD:
            snapshot: dict[str, Any] = {
                "dev": sysfs.parse_proc_net_dev(self._net_dev.read()), "dev_at": now}
        else:
            snapshot = {"dev": previous["dev"], "dev_at": previous["dev_at"]}
        # The qdiscs' counters (what the root qdisc passed on or dropped, what tc
        # filters shot) once a second in either mode.
        if not previous or now - previous["qdisc_at"] >= DEV_PERIOD:
            snapshot["qdisc"], snapshot["qdisc_at"] = self._read_qdiscs(), now
        else:
            snapshot["qdisc"], snapshot["qdisc_at"] = previous["qdisc"], previous["qdisc_at"]
        # Segments, from this network namespace; the tracepoint (all namespaces,
        # counting skbs) only says how they split across links. With eBPF the
        # congestion signals that must be fast (utilization, CE) come from the
        # maps, so retransmissions are taken once a second, like the NIC counters.
        if self.datapath is None or "dev_at" not in previous or snapshot["dev_at"] == now:
            retx_total = sysfs.snmp_value(self._snmp.read(), "Tcp", "RetransSegs") or 0
        else:
            retx_total = previous["retx_total"]
        snapshot["retx_total"] = retx_total
        datapath = self.datapath
        if datapath is not None:
            snapshot["bpf"] = datapath.read_links()
            # Walking the kernel's hash maps is the costly part of a pass: the
            # retransmit map only matters when segments were retransmitted, and
            # drop reasons are a diagnosis, refreshed once a second.
            if datapath.has_retransmits and retx_total != previous.get("retx_total"):
                snapshot["retx"] = datapath.read_retransmits()
            else:
                snapshot["retx"] = previous.get("retx") if datapath.has_retransmits else None
        return snapshot

    def _read_qdiscs(self) -> dict[int, InterfaceQdiscs]:
        try:
            found = self._qdisc.read(d.ifindex for d in self.devices)
        except OSError as exc:  # transmit is then as counted before the qdisc
            if not self._qdisc_error:
                log.warning("links: reading the qdisc counters failed: %s", exc)
            self._qdisc_error = f"qdisc counters unavailable: {exc.strerror or exc}"
            return {}
        self._qdisc_error = ""
        return found

    def _account(self, snapshot: dict[str, Any], previous: dict[str, Any] | None) -> None:
        """Fold what was read afresh of the NIC and qdisc counters into each link's account."""
        fresh_dev = previous is None or snapshot["dev_at"] != previous["dev_at"]
        fresh_qdisc = previous is None or snapshot["qdisc_at"] != previous["qdisc_at"]
        if not (fresh_dev or fresh_qdisc):
            return
        for device in self.devices:
            account = self._accounts[device.name]
            qdiscs = snapshot["qdisc"].get(device.ifindex) or InterfaceQdiscs(None, None)
            bpf: Counters | None = (snapshot.get("bpf") or {}).get(device.ifindex)
            if bpf is not None and fresh_qdisc:
                account.egress.update(bpf.total(EGRESS, BYTES), bpf.total(EGRESS, PACKETS),
                                      qdiscs.root)
            account.fold(snapshot["qdisc_at"] if fresh_qdisc else snapshot["dev_at"],
                         snapshot["dev"].get(device.name) if fresh_dev else None,
                         qdiscs if fresh_qdisc else None)

    def sample(self, now: float) -> LinkSample:
        mono = self.clock()
        if mono - (self._drops_at or 0.0) >= DROPS_PERIOD:
            self._read_drops(mono)
        if mono - self._speeds_at > 10.0:  # speeds change when links renegotiate
            self._refresh_speeds(mono)
        if mono - self._states_at >= STATE_PERIOD:
            self._refresh_states(mono)
        current = self._read()
        if self._last is not None and self._quiet(current):
            # No counter moved since the last pass: its all-zero sample stands.
            self._prev, self._prev_at = current, mono
            return self._last
        previous, self._prev = self._prev or current, current
        dt, self._prev_at = mono - self._prev_at, mono
        self._account(current, previous)
        retx_by_if, retx_total = self._retransmits(current, previous, dt, now)
        links = tuple(
            self._link(device, current, previous, dt, retx_by_if.get(device.ifindex, 0.0))
            for device in self.devices
        )
        links = tuple(self._with_retransmit_share(link, current) for link in links)
        sample = LinkSample(self.mode, dt, links, retx_total)
        idle = all(not (link.rx_pps or link.tx_pps or link.retransmits_per_s
                        or link.all_drops_per_s or link.errors_per_s) for link in links)
        self._last = sample if idle else None
        return sample

    def _quiet(self, current: dict[str, Any]) -> bool:
        """Nothing counted since the previous read (so every rate is zero again)."""
        previous = self._prev or {}
        return (current.get("bpf") == previous.get("bpf")
                and current["dev"] == previous.get("dev")
                and current["qdisc"] == previous.get("qdisc")
                and current.get("retx_total") == previous.get("retx_total"))

    def _with_retransmit_share(self, link: LinkRates, current: dict[str, Any]) -> LinkRates:
        """Retransmitted segments per sent packet, both counted over the same span.

        Retransmissions are refreshed less often than traffic (once a second with
        eBPF), and loss makes TCP bursty, so the share uses the packets sent over
        the retransmissions' own span, not this interval's.
        """
        at = current["dev_at"]
        base = self._retx_base.get(link.name)
        sent = link.totals.tx_packets
        if base is None or base[0] != at:
            if base is not None and at > base[0]:
                packets = (sent - base[1]) / (at - base[0]) if sent >= base[1] else 0.0
                self._retx_share[link.name] = (link.retransmits_per_s / packets if packets
                                               else 0.0)
            self._retx_base[link.name] = (at, sent)
        return dataclasses.replace(link, retransmit_fraction=self._retx_share.get(link.name, 0.0))

    def _retransmits(self, current: dict[str, Any], previous: dict[str, Any], dt: float,
                     now: float) -> tuple[dict[int, float], float]:
        """Retransmitted segments per second: per interface where attributable, and in all."""
        span = current["dev_at"] - previous["dev_at"] if self.datapath is not None else dt
        if span <= 0:  # not re-read this interval: the last rates stand
            return self._last_retx
        self._last_retx = self._retransmit_rates(current, previous, span, now)
        names = {d.ifindex: d.name for d in self.devices}
        for oif, per_s in self._last_retx[0].items():
            if oif in names:
                self._accounts[names[oif]].retransmits += per_s * span
        return self._last_retx

    def _retransmit_rates(self, current: dict[str, Any], previous: dict[str, Any], dt: float,
                          now: float) -> tuple[dict[int, float], float]:
        total = rate(current.get("retx_total", 0), previous.get("retx_total", 0), dt)
        if current.get("retx") is None or total <= 0:
            return {}, total
        events: dict[int, float] = {}
        all_events = 0.0
        before = previous.get("retx") or {}
        for prefix, count in current["retx"].items():
            per_s = rate(count, before.get(prefix, 0), dt)
            if per_s <= 0:
                continue
            all_events += per_s
            oif = self.routes.oif(prefix, now)
            if oif is not None:
                events[oif] = events.get(oif, 0.0) + per_s
        if all_events <= 0:
            return {}, total
        return {oif: total * n / all_events for oif, n in events.items()}, total

    def _read_drops(self, now: float) -> None:
        """Kernel drops by reason, on the observer's own schedule (every DROPS_PERIOD)."""
        self._drops_at = now
        if self.datapath is None or not self.datapath.has_drops:
            return
        counts = self.datapath.read_drops()
        latest, _, at, _ = self._drops if self._drops is not None else (counts, {}, now, now)
        self._drops = (counts, latest, now, at)

    def drops_by_reason(self) -> dict[str, dict[str, float]]:
        """Kernel drops by reason (eBPF only): the count since the programs were loaded
        and the rate over the last DROPS_PERIOD. A read changes nothing: every
        caller sees the same numbers for the same moment."""
        if self._drops is None:
            return {}
        counts, before, at, before_at = self._drops
        span = at - before_at
        names = self.datapath.drop_reasons if self.datapath is not None else {}
        return {
            names.get(reason, str(reason)): {
                "total": count,
                "per_s": rate(count, before.get(reason, 0), span) if span > 0 else 0.0,
            }
            for reason, count in sorted(counts.items())
        }

    def _link(self, device: NetDevice, current: dict[str, Any], previous: dict[str, Any],
              dt: float, retransmits: float) -> LinkRates:
        speed = self._speeds.get(device.name)
        link_class = self.cfg.link_classes.get(device.name, DEFAULT_CLASS)
        state = self._states.get(device.name, "absent")
        up = state in ("up", "unknown")
        account = self._accounts[device.name]
        dev_now: DevCounters | None = current["dev"].get(device.name)
        dev_before: DevCounters | None = previous["dev"].get(device.name)
        # Over each source's last span; between two reads the last rates stand.
        drops, errors, qdisc_drops, tc_drops = account.rates()
        bpf_now: Counters | None = current.get("bpf", {}).get(device.ifindex)
        bpf_before: Counters | None = (previous.get("bpf") or {}).get(device.ifindex)
        if bpf_now is not None and bpf_before is not None:
            traffic = bpf_traffic(bpf_now, bpf_before, dt, account.egress)
        else:
            traffic = dev_traffic(dev_now, dev_before, dt, account.dev_base)
        return LinkRates(
            device.name, link_class, up, speed, traffic.rx_bps, traffic.tx_bps,
            traffic.rx_pps, traffic.tx_pps, _utilization(traffic.rx_bps, speed),
            _utilization(traffic.tx_bps, speed), traffic.ect_fraction, traffic.ce_fraction,
            retransmits, drops, errors, traffic.classes, account.totals(traffic),
            qdisc_drops_per_s=qdisc_drops, tc_drops_per_s=tc_drops,
        )
