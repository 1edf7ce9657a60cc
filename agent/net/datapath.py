"""The eBPF datapath: compile ``bpf/*.c`` with bcc, attach, and read the counters.

Kernel features are probed first (bcc importable, kernel headers present,
tracefs mounted, tracepoints and their fields); every failure becomes one
clear sentence in :class:`BpfUnavailable`, and the link observer falls back
to /proc counters. Tracepoint offsets come from tracefs and reach the C as
cflags; interfaces and DSCP classes reach it through maps.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.net import tracefs
from agent.net.sysfs import NetDevice
from agent.net.tc import Tc

log = logging.getLogger(__name__)

CLASSES = 8
DIRS = 2
FIELDS = 4  # bytes, packets, ECN-capable, CE-marked
BYTES, PACKETS, ECT, CE = range(FIELDS)
INGRESS, EGRESS = 0, 1
COUNTERS_SIZE = DIRS * CLASSES * FIELDS * 8
IF_TABLE = 4096  # as in bpf/link_counters.c


class BpfUnavailable(Exception):
    """The eBPF datapath cannot run here; the message says why in one line."""


def default_bpf_dir() -> Path:
    """Where the C sources are: next to the package, or where an install put them."""
    candidates = [
        os.environ.get("HARMONAIZE_BPF_DIR", ""),
        str(Path(__file__).resolve().parents[2] / "bpf"),
        "/usr/share/harmonaize/bpf",
        "/usr/local/share/harmonaize/bpf",
    ]
    for candidate in candidates:
        if candidate and (Path(candidate) / "link_counters.c").is_file():
            return Path(candidate)
    return Path(candidates[1])


def headers_present() -> bool:
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return True
    release = platform.release()
    return (Path("/lib/modules") / release / "build").exists() or Path(
        "/sys/kernel/kheaders.tar.xz"
    ).exists()


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
        self._links: Any = None
        self._events: Any = None
        self._lib: Any = None
        self._ncpus = 1
        self._tc: Tc | None = None
        self._created_clsact: set[int] = set()
        self._have_retransmits = False
        self._have_drops = False
        self._batch = True
        #: Drop reason names of the running kernel (the enum differs between kernels).
        self.drop_reasons: dict[int, str] = {}

    # --- set-up ---------------------------------------------------------------------

    def load(self) -> None:
        try:
            from bcc import BPF, lib  # noqa: PLC0415 - optional: absent means fallback
            from bcc.utils import get_possible_cpus  # noqa: PLC0415
        except ImportError:
            raise BpfUnavailable("bcc is not installed (Debian package python3-bpfcc)") from None
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
        self._lib = lib
        self._ncpus = len(get_possible_cpus())
        try:
            self._links = BPF(src_file=str(source), cflags=[f"-DHZ_MAX_SLOTS={self.max_slots}"])
            self._ingress = self._links.load_func("hz_tc_ingress", BPF.SCHED_CLS)
            self._egress = self._links.load_func("hz_tc_egress", BPF.SCHED_CLS)
        except Exception as exc:
            raise BpfUnavailable(f"bcc could not compile or load {source.name}: {exc}") from None
        if self.want_tracepoints:
            self._load_events(BPF)
        else:
            self.events_detail = "tracepoints off by configuration"

    def _load_events(self, bpf_cls: Any) -> None:
        root = tracefs.tracefs_root() or tracefs.mount_tracefs()
        if root is None:
            self.events_detail = "tracefs is not mounted: retransmits and drops from /proc"
            return
        cflags = [f"-DHZ_PREFIX_V4={self.prefix_v4}", f"-DHZ_PREFIX_V6={self.prefix_v6}"]
        retx = tracefs.read_format("tcp", "tcp_retransmit_skb", root)
        offsets = (retx.offset("family"), retx.offset("daddr"), retx.offset("daddr_v6")) \
            if retx else (None, None, None)
        if None not in offsets:
            cflags += [f"-DHZ_RETX_FAMILY_OFF={offsets[0]}", f"-DHZ_RETX_DADDR_OFF={offsets[1]}",
                       f"-DHZ_RETX_DADDR6_OFF={offsets[2]}"]
        kfree = tracefs.read_format("skb", "kfree_skb", root)
        reason_offset = kfree.offset("reason") if kfree else None
        if reason_offset is not None and kfree is not None:
            cflags.append(f"-DHZ_KFREE_REASON_OFF={reason_offset}")
            self.drop_reasons = kfree.symbols("reason")
        missing = []
        try:
            self._events = bpf_cls(src_file=str(self.bpf_dir / "net_events.c"), cflags=cflags)
            if None not in offsets:
                self._events.attach_tracepoint(tp="tcp:tcp_retransmit_skb",
                                               fn_name="hz_tcp_retransmit")
                self._have_retransmits = True
            else:
                missing.append("tcp:tcp_retransmit_skb")
            if reason_offset is not None:
                self._events.attach_tracepoint(tp="skb:kfree_skb", fn_name="hz_kfree_skb")
                self._have_drops = True
            else:
                missing.append("skb:kfree_skb with a reason")
        except Exception as exc:
            self.events_detail = f"tracepoints unavailable ({exc}): retransmits from /proc"
            self._have_retransmits = self._have_drops = False
            return
        self.events_detail = "retransmits and drops from tracepoints" if not missing else (
            "no " + " or ".join(missing) + ": those from /proc"
        )

    @property
    def has_retransmits(self) -> bool:
        return self._have_retransmits

    @property
    def has_drops(self) -> bool:
        return self._have_drops

    def attach(self, devices: Sequence[NetDevice]) -> None:
        """Attach to ``devices`` (after removing any filters a killed agent left)."""
        if self._links is None:
            raise RuntimeError("load() first")
        if len(devices) > self.max_slots:
            raise BpfUnavailable(f"{len(devices)} interfaces exceed {self.max_slots} slots")
        keys = [d.ifindex % IF_TABLE for d in devices]
        if len(set(keys)) != len(keys):
            raise BpfUnavailable(f"interface indexes collide modulo {IF_TABLE}")
        self._tc = Tc()
        self.stale_removed = self._tc.remove_stale()
        if self.stale_removed:
            log.warning("removed filters left by a previous agent: %s", self.stale_removed)
        table = self._links["hz_if_table"]
        classes = (ctypes.c_uint8 * 64)(*self.dscp_classes)
        for slot, device in enumerate(devices):
            table[ctypes.c_int(device.ifindex % IF_TABLE)] = table.Leaf(
                device.ifindex, slot, device.l2_len, classes)
            if self._tc.ensure_clsact(device.ifindex):
                self._created_clsact.add(device.ifindex)
            self._tc.attach(device.ifindex, self._ingress.fd, self._ingress.name, "ingress")
            self._tc.attach(device.ifindex, self._egress.fd, self._egress.name, "egress")
            self.attached[device.ifindex] = device.name
        self._slots = {d.ifindex: i for i, d in enumerate(devices)}

    # --- reading --------------------------------------------------------------------

    def read_links(self) -> dict[int, Counters]:
        """Every watched interface's counters, in one batched map read where possible."""
        stride = COUNTERS_SIZE // 8
        n = len(self._slots)
        raw = self._read_slots(n)
        if raw is None:
            return {}
        words = memoryview(raw).cast("Q")
        out = {}
        for ifindex, slot in self._slots.items():
            base = slot * self._ncpus
            if self._ncpus == 1:
                values = words[base * stride:(base + 1) * stride].tolist()
            else:  # one row of counters per CPU: add them up column by column
                rows = [words[(base + c) * stride:(base + c + 1) * stride]
                        for c in range(self._ncpus)]
                values = [sum(column) for column in zip(*rows, strict=True)]
            out[ifindex] = Counters(values)
        return out

    def _read_slots(self, n: int) -> bytes | None:
        """Raw per-CPU values of slots 0..n-1: one BPF_MAP_LOOKUP_BATCH, else n lookups."""
        fd = self._links["hz_link_counters"].map_fd
        size = COUNTERS_SIZE * self._ncpus
        values = ctypes.create_string_buffer(size * n)
        if self._batch:
            keys = (ctypes.c_uint32 * n)()
            count, out_batch = ctypes.c_uint32(n), ctypes.c_uint32(0)
            result = self._lib.bpf_lookup_batch(fd, None, ctypes.byref(out_batch), keys, values,
                                                ctypes.byref(count))
            if result == 0 or count.value == n:
                return values.raw
            self._batch = False  # kernel without batch operations on arrays
            log.info("batched map reads unavailable (%d): reading slot by slot", result)
        one = ctypes.create_string_buffer(size)
        for slot in range(n):
            key = ctypes.c_uint32(slot)
            if self._lib.bpf_lookup_elem(fd, ctypes.byref(key), one) != 0:
                return None
            ctypes.memmove(ctypes.addressof(values) + slot * size, one, size)
        return values.raw

    def read_retransmits(self) -> dict[Prefix, int]:
        if not self._have_retransmits:
            return {}
        out = {}
        for key, values in self._events["hz_retransmits"].items():
            size = 4 if key.family == 2 else 16
            prefix = Prefix(key.family, bytes(key.addr[:size]), key.length)
            out[prefix] = sum(values)
        return out

    def read_drops(self) -> dict[int, int]:
        if not self._have_drops:
            return {}
        return {key.value: sum(values) for key, values in self._events["hz_drops"].items()}

    # --- tear-down ------------------------------------------------------------------

    def close(self) -> None:
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
        for bpf in (self._events, self._links):
            if bpf is not None:
                bpf.cleanup()
        self._events = self._links = None
