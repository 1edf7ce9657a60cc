"""The link observer's settings (``[observers.links]``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, ClassVar

from harmonaize.config import AbsPath
from harmonaize.schema import Fraction, Ident, Len, Name, Num, Str

Globs = Annotated[tuple[Annotated[str, Str(max_len=64, min_len=1)], ...], Len(64)]


class LinkMode(StrEnum):
    AUTO = "auto"  # eBPF where it works, else /proc counters
    EBPF = "ebpf"  # eBPF or fail
    PROC = "proc"  # /proc and /sys counters only


@dataclass(frozen=True)
class LinksSection:
    STRICT_KEYS: ClassVar[bool] = True
    LIVE: ClassVar[frozenset[str]] = frozenset({
        "utilization_low", "utilization_high", "ce_low", "ce_high", "retransmit_low",
        "retransmit_high", "min_packets_per_s", "hold"})
    enabled: bool = True
    mode: LinkMode = LinkMode.AUTO
    #: Interface name globs to watch; empty watches physical and RDMA-capable NICs.
    include: Globs = ()
    exclude: Globs = ()
    #: With no include list, also watch virtual interfaces (veth, bridges, tunnels).
    include_virtual: bool = False
    #: Link speed in Mb/s per interface, overriding sysfs (shaped or virtual links).
    speeds: dict[Name, Annotated[int, Num(1, 10_000_000)]] = field(default_factory=dict)
    #: Class of each interface ("data", "storage", ...) for aggregated health; default "data".
    link_classes: dict[Name, Ident] = field(default_factory=dict)
    #: Traffic class (0-7) -> DSCP values in it; unlisted DSCPs use their precedence (DSCP >> 3).
    dscp_classes: dict[Annotated[str, Str(pattern=r"[0-7]")], Annotated[
        tuple[Annotated[int, Num(0, 63)], ...], Len(64)]] = field(default_factory=dict)
    #: Count retransmissions and drops with tracepoints (else from /proc).
    tracepoints: bool = True
    #: Retransmissions are aggregated in the kernel by destination prefix of this length.
    retransmit_prefix_v4: Annotated[int, Num(8, 32)] = 24
    retransmit_prefix_v6: Annotated[int, Num(16, 128)] = 64
    #: Utilization (busier direction) at which congestion is low / high.
    utilization_low: Fraction = 0.6
    utilization_high: Fraction = 0.85
    #: Share of received packets marked CE (or RDMA CNPs per packet) for low / high.
    ce_low: Fraction = 0.001
    ce_high: Fraction = 0.01
    #: Retransmitted segments per transmitted packet for low / high.
    retransmit_low: Fraction = 0.001
    retransmit_high: Fraction = 0.01
    #: Below this many packets per second, CE and retransmit shares are noise and ignored.
    min_packets_per_s: Annotated[float, Num(0.0, 1e9)] = 1000.0
    #: Seconds a lower level must persist before a link's level falls (rises are immediate).
    hold: Annotated[float, Num(0.0, 3600.0)] = 2.0
    sysfs_root: AbsPath = "/sys"
    procfs_root: AbsPath = "/proc"
    #: Directory of the BPF C sources; empty finds the installed ones.
    bpf_dir: Annotated[str, Str(max_len=4096, pattern=r"/.*")] = ""

    def __post_init__(self) -> None:
        if not self.utilization_low <= self.utilization_high:
            raise ValueError("utilization_low must not exceed utilization_high")
        if not self.ce_low <= self.ce_high:
            raise ValueError("ce_low must not exceed ce_high")
        if not self.retransmit_low <= self.retransmit_high:
            raise ValueError("retransmit_low must not exceed retransmit_high")
