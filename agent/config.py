"""The agent's configuration (``/etc/harmonaize/agent.toml``) with its defaults.

Every field has a default, so the agent runs with no file at all. Unknown keys
and values of the wrong type are rejected with the key named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar

from harmonaize import config
from harmonaize.config import AbsPath, Endpoint, LogLevel
from harmonaize.schema import Fraction, Ident, Len, Name, Num, Str

DEFAULT_PATH = Path("/etc/harmonaize/agent.toml")


@dataclass(frozen=True)
class AgentSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Name this host reports to the controller; empty means the hostname.
    host_id: Name = ""
    #: Capacity pool the host belongs to (a scheduling partition).
    pool: Ident = "default"
    #: GPU class the host advertises; "auto" takes it from the GPUs found.
    gpu_class: Ident = "auto"
    #: Sampling interval of the observer loop, in seconds.
    interval: Annotated[float, Num(0.01, 60.0)] = 0.1
    state_dir: AbsPath = "/var/lib/harmonaize"
    log_level: LogLevel = LogLevel.INFO


@dataclass(frozen=True)
class SocketSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Operator socket: line-delimited JSON, checked with SO_PEERCRED.
    path: AbsPath = "/run/harmonaize/agent.sock"
    #: Members of this group may run read-only commands; root may run all.
    group: Name = "harmonaize"
    mode: Annotated[int, Num(0, 0o777)] = 0o660


@dataclass(frozen=True)
class ControllerSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Where the controller ingests agent messages; empty runs the host alone.
    endpoint: Endpoint = ""
    #: Seconds between heartbeats; the controller counts a host down after a few missed.
    heartbeat: Annotated[float, Num(0.05, 600.0)] = 1.0
    #: Seconds after which an unchanged host summary is republished in full.
    summary_refresh: Annotated[float, Num(0.5, 3600.0)] = 30.0
    #: Seconds to wait for an acknowledgement before resending.
    ack_timeout: Annotated[float, Num(0.05, 600.0)] = 2.0
    #: Unacknowledged messages kept while the controller is away; oldest
    #: events are dropped (and counted) beyond this, conditions never are.
    outbox_limit: Annotated[int, Num(10, 1_000_000)] = 10_000


@dataclass(frozen=True)
class HostObserverSection:
    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    #: Memory pressure holds while available memory is below this fraction.
    memory_available_min: Fraction = 0.05
    #: ... for at least this many seconds (one dip does not flap the condition).
    sustain: Annotated[float, Num(0.0, 3600.0)] = 2.0


class LinkMode(StrEnum):
    AUTO = "auto"  # eBPF where it works, else /proc counters
    EBPF = "ebpf"  # eBPF or fail
    PROC = "proc"  # /proc and /sys counters only


Globs = Annotated[tuple[Annotated[str, Str(max_len=64, min_len=1)], ...], Len(64)]
Prefix = Annotated[int, Num(0, 128)]


@dataclass(frozen=True)
class LinksSection:
    STRICT_KEYS: ClassVar[bool] = True
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


@dataclass(frozen=True)
class RdmaSection:
    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    sysfs_root: AbsPath = "/sys"
    #: Class of each RDMA port ("mlx5_0/1") or its net device; default "data".
    link_classes: dict[Name, Ident] = field(default_factory=dict)


@dataclass(frozen=True)
class ObserversSection:
    STRICT_KEYS: ClassVar[bool] = True
    host: HostObserverSection = field(default_factory=HostObserverSection)
    links: LinksSection = field(default_factory=LinksSection)
    rdma: RdmaSection = field(default_factory=RdmaSection)


@dataclass(frozen=True)
class AgentConfig:
    STRICT_KEYS: ClassVar[bool] = True
    agent: AgentSection = field(default_factory=AgentSection)
    socket: SocketSection = field(default_factory=SocketSection)
    controller: ControllerSection = field(default_factory=ControllerSection)
    observers: ObserversSection = field(default_factory=ObserversSection)


def load(path: Path | None = None) -> tuple[AgentConfig, Path | None]:
    return config.load(AgentConfig, path, default=DEFAULT_PATH)
