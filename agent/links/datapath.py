"""The eBPF datapath: load ``bpf/*.c``, attach to tc, read the counters.

Kernel features are probed first (bcc installed, kernel headers present,
tracefs mounted, tracepoints and their fields); every failure becomes one
clear sentence in :class:`BpfUnavailable`, and the link observer falls back
to /proc counters. Tracepoint offsets come from tracefs and reach the C as
cflags; interfaces and DSCP classes reach it through a map. bcc compiles in a
child process (:mod:`agent.kernel.bpfload`); this process only holds the
descriptors and reads the maps with bpf(2).
"""

from __future__ import annotations

import logging
import os
import platform
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.kernel import bpfload, tracefs
from agent.kernel.bpfload import Loaded
from agent.kernel.bpfprobe import BpfUnavailable, bcc_present, default_bpf_dir, headers_present
from agent.kernel.bpfsys import BpfMap, ProgStats, prog_stats
from agent.kernel.sysfs import NetDevice
from agent.kernel.tc import Tc

log = logging.getLogger(__name__)

CLASSES = 8
DIRS = 2
FIELDS = 4  # bytes, packets, ECN-capable, CE-marked
BYTES, PACKETS, ECT, CE = range(FIELDS)
INGRESS, EGRESS = 0, 1
COUNTERS_SIZE = DIRS * CLASSES * FIELDS * 8


def dscp_map(classes: dict[int, Sequence[int]] | None = None) -> list[int]:
    """DSCP (0..63) -> class (0..7). Default: the IP precedence, DSCP >> 3."""
    table = [dscp >> 3 for dscp in range(64)]
    for cls, values in (classes or {}).items():
        for dscp in values:
            table[dscp] = cls
    return table


class Counters:
    """One interface's counters summed over CPUs: [direction][class][field]."""

    __slots__ = ("_totals", "values")

    def __init__(self, values: list[int]) -> None:
        self.values = values
        # Per direction and field over all classes, computed once per read: the
        # classes of one direction and field are every FIELDS-th value.
        span = CLASSES * FIELDS
        self._totals = [
            sum(values[d * span + f:(d + 1) * span:FIELDS])
            for d in range(DIRS) for f in range(FIELDS)
        ]

    def get(self, direction: int, cls: int, field: int) -> int:
        return self.values[(direction * CLASSES + cls) * FIELDS + field]

    def total(self, direction: int, field: int) -> int:
        return self._totals[direction * FIELDS + field]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Counters) and other.values == self.values

    __hash__ = None  # type: ignore[assignment]


def dscp_words(classes: Sequence[int]) -> list[int]:
    """The DSCP-to-class table as bpf/link_counters.c takes it: DSCP d's class in bits
    4*(d%16) of word d//16."""
    return [sum((classes[16 * w + i] & 7) << (4 * i) for i in range(16)) for w in range(4)]


def programs(devices: Sequence[NetDevice]) -> tuple[str, dict[int, tuple[str, str]]]:
    """C for a pair of programs per interface (its counter slot and link-layer header
    length compiled in), and ifindex -> (ingress, egress) program names."""
    lines, names = [], {}
    for slot, device in enumerate(devices):
        l2_len = min(64, device.l2_len)
        pair = (f"hz_tc_i{slot}", f"hz_tc_e{slot}")
        for direction, name in enumerate(pair):
            lines.append(f"int {name}(struct __sk_buff *skb) "
                         f"{{ return hz_count(skb, {direction}, {slot}, {l2_len}); }}")
        names[device.ifindex] = pair
    return "\n".join(lines) + "\n", names


@dataclass(frozen=True)
class Prefix:
    family: int
    address: bytes
    length: int


class LinkDatapath:
    def __init__(
        self,
        bpf_dir: Path | None = None,
        *,
        max_slots: int = 32,
        dscp_classes: Sequence[int] | None = None,
        prefix_v4: int = 24,
        prefix_v6: int = 64,
        tracepoints: bool = True,
    ) -> None:
        self.bpf_dir = bpf_dir or default_bpf_dir()
        self.max_slots = max_slots
        self.dscp_classes = list(dscp_classes or dscp_map())
        self.prefix_v4, self.prefix_v6 = prefix_v4, prefix_v6
        self.want_tracepoints = tracepoints
        self.events_detail = "tracepoints not loaded"
        self.attached: dict[int, str] = {}  # ifindex -> name
        self.stale_removed: dict[str, int] = {}
        #: Drop reason names of the running kernel (the enum differs between kernels).
        self.drop_reasons: dict[int, str] = {}
        self._links: Loaded | None = None
        self._events: Loaded | None = None
        self._tc: Tc | None = None
        self._created_clsact: set[int] = set()
        self._slots: dict[int, int] = {}
        self._devices: list[NetDevice] = []
        self._programs: dict[int, tuple[str, str]] = {}
        self._tracepoints: set[str] = set()
        self._last_raw: bytes | None = None
        self._last_links: dict[int, Counters] = {}

    # --- set-up ---------------------------------------------------------------------

    def load(self, devices: Sequence[NetDevice]) -> None:
        """Compile and load, for ``devices``, in a child process; fail with one clear
        sentence. Each interface gets its own pair of programs (see bpf/link_counters.c)."""
        if not bcc_present():
            raise BpfUnavailable("bcc is not installed (Debian package python3-bpfcc)")
        if os.geteuid() != 0:
            raise BpfUnavailable("loading eBPF programs needs root (CAP_BPF, CAP_NET_ADMIN)")
        if not headers_present():
            raise BpfUnavailable(
                f"no kernel headers for {platform.release()} "
                f"(/lib/modules/{platform.release()}/build is missing)"
            )
        source = self.bpf_dir / "link_counters.c"
        if not source.is_file():
            raise BpfUnavailable(f"BPF source {source} not found")
        if len(devices) > self.max_slots:
            raise BpfUnavailable(f"{len(devices)} interfaces exceed {self.max_slots} slots")
        self._devices = list(devices)
        extra, self._programs = programs(self._devices)
        cflags = [f"-DHZ_MAX_SLOTS={self.max_slots}"] + [
            f"-DHZ_DSCP_W{i}={word:#x}ULL" for i, word in enumerate(dscp_words(self.dscp_classes))]
        try:
            self._links = bpfload.load([bpfload.Request(
                str(source), cflags,
                {name: "sched_cls" for pair in self._programs.values() for name in pair},
                extra=extra)])
        except bpfload.LoadError as exc:
            raise BpfUnavailable(str(exc)) from None
        if self.want_tracepoints:
            self._load_events()
        else:
            self.events_detail = "tracepoints off by configuration"

    def _load_events(self) -> None:
        root = tracefs.tracefs_root() or tracefs.mount_tracefs()
        if root is None:
            self.events_detail = "tracefs is not mounted: retransmits and drops from /proc"
            return
        cflags = [f"-DHZ_PREFIX_V4={self.prefix_v4}", f"-DHZ_PREFIX_V6={self.prefix_v6}"]
        tracepoints: dict[str, str] = {}
        missing = []
        retx = tracefs.read_format("tcp", "tcp_retransmit_skb", root)
        offsets = (retx.offset("family"), retx.offset("daddr"), retx.offset("daddr_v6")) \
            if retx else (None, None, None)
        if None not in offsets:
            cflags += [f"-DHZ_RETX_FAMILY_OFF={offsets[0]}", f"-DHZ_RETX_DADDR_OFF={offsets[1]}",
                       f"-DHZ_RETX_DADDR6_OFF={offsets[2]}"]
            tracepoints["tcp:tcp_retransmit_skb"] = "hz_tcp_retransmit"
        else:
            missing.append("tcp:tcp_retransmit_skb")
        kfree = tracefs.read_format("skb", "kfree_skb", root)
        reason_offset = kfree.offset("reason") if kfree else None
        if reason_offset is not None and kfree is not None:
            cflags.append(f"-DHZ_KFREE_REASON_OFF={reason_offset}")
            tracepoints["skb:kfree_skb"] = "hz_kfree_skb"
            self.drop_reasons = kfree.symbols("reason")
        else:
            missing.append("skb:kfree_skb with a reason")
        if not tracepoints:
            self.events_detail = "no usable tracepoints: retransmits and drops from /proc"
            return
        try:
            self._events = bpfload.load([bpfload.Request(
                str(self.bpf_dir / "net_events.c"), cflags, {}, tracepoints)])
        except bpfload.LoadError as exc:
            self.events_detail = f"tracepoints unavailable ({exc}): retransmits from /proc"
            return
        self._tracepoints = set(tracepoints)
        self.events_detail = "retransmits and drops from tracepoints" if not missing else (
            "no " + " or ".join(missing) + ": those from /proc"
        )

    @property
    def has_retransmits(self) -> bool:
        return "tcp:tcp_retransmit_skb" in self._tracepoints

    @property
    def has_drops(self) -> bool:
        return "skb:kfree_skb" in self._tracepoints

    def attach(self) -> None:
        """Attach to the interfaces loaded for (after removing any filters a killed
        agent left)."""
        if self._links is None:
            raise RuntimeError("load() first")
        self._tc = Tc()
        self.stale_removed = self._tc.remove_stale()
        if self.stale_removed:
            log.warning("removed filters left by a previous agent: %s", self.stale_removed)
        for device in self._devices:
            if self._tc.ensure_clsact(device.ifindex):
                self._created_clsact.add(device.ifindex)
            # Filters carry their program's name: hz_tc_ is how a restarted agent
            # recognises what a killed one left (tc.OUR_PREFIX).
            for direction, program in zip(("ingress", "egress"), self._programs[device.ifindex],
                                          strict=True):
                self._tc.attach(device.ifindex, self._links.programs[program], program,
                                direction)
            self.attached[device.ifindex] = device.name
        self._slots = {d.ifindex: i for i, d in enumerate(self._devices)}

    # --- reading --------------------------------------------------------------------

    def read_links(self) -> dict[int, Counters]:
        """Every watched interface's counters, in one batched map read where possible."""
        assert self._links is not None
        counters = self._links.maps["hz_link_counters"]
        stride = COUNTERS_SIZE // 8
        n = len(self._slots)
        raw = counters.lookup_batch(n) or self._read_one_by_one(counters, n)
        if raw is None:
            return {}
        if raw == self._last_raw:
            return self._last_links  # nothing counted since: skip summing per CPU
        words = memoryview(raw).cast("Q")
        ncpus = counters.ncpus
        out = {}
        for ifindex, slot in self._slots.items():
            base = slot * ncpus
            if ncpus == 1:
                values = words[base * stride:(base + 1) * stride].tolist()
            else:  # one row of counters per CPU: add them up column by column
                rows = [words[(base + c) * stride:(base + c + 1) * stride] for c in range(ncpus)]
                values = [sum(column) for column in zip(*rows, strict=True)]
            out[ifindex] = Counters(values)
        self._last_raw, self._last_links = raw, out
        return out

    @staticmethod
    def _read_one_by_one(counters: BpfMap, n: int) -> bytes | None:
        """For kernels without batch operations on arrays (before 5.6)."""
        parts = []
        for slot in range(n):
            value = counters.lookup(struct.pack("<I", slot))
            if value is None:
                return None
            parts.append(value)
        return b"".join(parts)

    def read_retransmits(self) -> dict[Prefix, int]:
        if not self.has_retransmits:
            return {}
        assert self._events is not None
        table = self._events.maps["hz_retransmits"]
        out = {}
        for key in table.keys(limit=table.max_entries):
            value = table.lookup(key)
            if value is None:
                continue  # evicted between listing and reading
            family, length, address = struct.unpack("<HH16s", key[:20])
            size = 4 if family == 2 else 16
            out[Prefix(family, address[:size], length)] = table.sum_percpu_u64(value)
        return out

    def read_drops(self) -> dict[int, int]:
        if not self.has_drops:
            return {}
        assert self._events is not None
        table = self._events.maps["hz_drops"]
        out = {}
        for key in table.keys(limit=table.max_entries):
            value = table.lookup(key)
            if value is not None:
                out[struct.unpack("<I", key)[0]] = table.sum_percpu_u64(value)
        return out

    def program_stats(self) -> dict[str, ProgStats]:
        """The tc programs' run time and run count (counted while kernel.bpf_stats_enabled
        is set): what ``./scripts/bench datapath-cost`` reports."""
        if self._links is None:
            return {}
        return {name: prog_stats(fd) for name, fd in self._links.programs.items()}

    # --- tear-down ------------------------------------------------------------------

    def detach(self) -> None:
        """Remove our filters (and a clsact we added); the programs stay loaded."""
        if self._tc is not None:
            for ifindex in list(self.attached):
                try:
                    self._tc.remove_ours(ifindex)
                    if ifindex in self._created_clsact:
                        self._tc.drop_clsact_if_unused(ifindex)
                except Exception as exc:  # the interface may be gone already
                    log.debug("detach from ifindex %s: %s", ifindex, exc)
            self._tc.close()
            self._tc = None
        self.attached.clear()
        self._created_clsact.clear()

    def close(self) -> None:
        self.detach()
        for loaded in (self._events, self._links):
            if loaded is not None:
                loaded.close()  # closing the descriptors detaches and frees
        self._events = self._links = None
        self._tracepoints = set()
