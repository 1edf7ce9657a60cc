"""The agent's configuration (``/etc/harmonaize/agent.toml``) with its defaults.

Every field has a default, so the agent runs with no file at all. Unknown keys
and values of the wrong type are rejected with the key named.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, ClassVar

from agent.energy.settings import EnergySection
from agent.gpu.settings import GpuObserverSection
from agent.host.settings import HostObserverSection
from agent.jobhealth.settings import JobHealthSection
from agent.links.settings import LinksSection
from agent.rdma.settings import RdmaControlSection, RdmaSection
from agent.remediation.settings import RemediationSection
from agent.tuning.settings import TuningSection
from agent.validation.settings import ValidationSection
from harmonaize import config
from harmonaize.config import AbsPath, Endpoint, LogLevel, MetricsSection, OptionalPath
from harmonaize.schema import Ident, Len, Name, Num

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
    #: A clustered controller's replicas (any of them takes any host): the agent starts
    #: at one picked by its host id (so hosts spread over them) and moves to the next
    #: when its replica goes away. Empty: ``endpoint`` alone.
    endpoints: Annotated[tuple[Endpoint, ...], Len(64)] = ()
    #: Seconds without a connection, or with messages sent and none acknowledged,
    #: before the agent moves to the next of ``endpoints``.
    failover: Annotated[float, Num(0.1, 600.0)] = 3.0
    #: Seconds between heartbeats; the controller counts a host down after a few missed.
    heartbeat: Annotated[float, Num(0.05, 600.0)] = 1.0
    #: Seconds after which an unchanged host summary is republished in full.
    summary_refresh: Annotated[float, Num(0.5, 3600.0)] = 30.0
    #: Seconds to wait for an acknowledgement before resending.
    ack_timeout: Annotated[float, Num(0.05, 600.0)] = 2.0
    #: Unacknowledged messages kept while the controller is away; oldest
    #: events are dropped (and counted) beyond this, conditions never are.
    outbox_limit: Annotated[int, Num(10, 1_000_000)] = 10_000
    #: This host's CurveZMQ key pair, filed at the controller under the host id.
    secret_key: OptionalPath = "/etc/harmonaize/keys/agent.key_secret"
    #: The controller's public key; empty connects without CurveZMQ (only to a
    #: controller with auth.mode = "none").
    server_key: OptionalPath = "/etc/harmonaize/keys/controller.key"
    #: Keep unacknowledged events in ``state_dir`` so they survive an agent restart.
    spool: bool = True






Prefix = Annotated[int, Num(0, 128)]






















@dataclass(frozen=True)
class ObserversSection:
    STRICT_KEYS: ClassVar[bool] = True
    host: HostObserverSection = field(default_factory=HostObserverSection)
    links: LinksSection = field(default_factory=LinksSection)
    rdma: RdmaSection = field(default_factory=RdmaSection)
    gpu: GpuObserverSection = field(default_factory=GpuObserverSection)


def changes(old: ObserversSection, new: ObserversSection) -> tuple[list[str], list[str]]:
    """What differs between two observer configurations, as dotted names: (settings
    the running engines take on a reload, settings the observers were started with).

    Only the latter restart the observers (NVML, the BPF programs): a threshold
    must not cost a GPU's history or a link's counters.
    """
    live: list[str] = []
    io: list[str] = []
    for section in fields(ObserversSection):
        before, after = getattr(old, section.name), getattr(new, section.name)
        allowed = getattr(type(before), "LIVE", frozenset())
        for item in fields(before):
            if getattr(before, item.name) != getattr(after, item.name):
                name = f"observers.{section.name}.{item.name}"
                (live if item.name in allowed else io).append(name)
    return live, io
























@dataclass(frozen=True)
class AgentConfig:
    STRICT_KEYS: ClassVar[bool] = True
    agent: AgentSection = field(default_factory=AgentSection)
    socket: SocketSection = field(default_factory=SocketSection)
    controller: ControllerSection = field(default_factory=ControllerSection)
    observers: ObserversSection = field(default_factory=ObserversSection)
    validation: ValidationSection = field(default_factory=ValidationSection)
    tuning: TuningSection = field(default_factory=TuningSection)
    energy: EnergySection = field(default_factory=EnergySection)
    rdma: RdmaControlSection = field(default_factory=RdmaControlSection)
    remediation: RemediationSection = field(default_factory=RemediationSection)
    jobhealth: JobHealthSection = field(default_factory=JobHealthSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)


def load(path: Path | None = None) -> tuple[AgentConfig, Path | None]:
    return config.load(AgentConfig, path, default=DEFAULT_PATH)
