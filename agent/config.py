"""The agent's configuration (``/etc/harmonaize/agent.toml``) with its defaults.

Every field has a default, so the agent runs with no file at all. Unknown keys
and values of the wrong type are rejected with the key named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar

from harmonaize import config
from harmonaize.config import AbsPath, Endpoint, LogLevel
from harmonaize.schema import Fraction, Ident, Name, Num

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


@dataclass(frozen=True)
class ObserversSection:
    STRICT_KEYS: ClassVar[bool] = True
    host: HostObserverSection = field(default_factory=HostObserverSection)


@dataclass(frozen=True)
class AgentConfig:
    STRICT_KEYS: ClassVar[bool] = True
    agent: AgentSection = field(default_factory=AgentSection)
    socket: SocketSection = field(default_factory=SocketSection)
    controller: ControllerSection = field(default_factory=ControllerSection)
    observers: ObserversSection = field(default_factory=ObserversSection)


def load(path: Path | None = None) -> tuple[AgentConfig, Path | None]:
    return config.load(AgentConfig, path, default=DEFAULT_PATH)
