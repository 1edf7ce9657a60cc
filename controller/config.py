"""The controller's configuration (``/etc/harmonaize/controller.toml``) with its defaults."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar

from harmonaize import config
from harmonaize.config import AbsPath, Endpoint, LogLevel
from harmonaize.schema import Len, Name, Num

DEFAULT_PATH = Path("/etc/harmonaize/controller.toml")

Edges = Annotated[tuple[Annotated[int, Num(0, 2**40)], ...], Len(64, min_len=1)]


@dataclass(frozen=True)
class ControllerSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Agents connect here (ZeroMQ ROUTER).
    listen: Endpoint = "tcp://*:7400"
    #: Tenants subscribe here (ZeroMQ XPUB).
    feed: Endpoint = "tcp://*:7401"
    admin_socket: AbsPath = "/run/harmonaize/controller.sock"
    admin_group: Name = "harmonaize"
    database: AbsPath = "/var/lib/harmonaize/controller.db"
    log_level: LogLevel = LogLevel.INFO


@dataclass(frozen=True)
class LivenessSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: A host is counted down after this many heartbeat intervals of silence.
    missed_heartbeats: Annotated[int, Num(1, 1000)] = 3
    #: How often liveness is checked, in seconds.
    check_interval: Annotated[float, Num(0.05, 60.0)] = 0.25


@dataclass(frozen=True)
class FeedSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Seconds between full republications of every condition on the feed.
    republish: Annotated[float, Num(0.5, 3600.0)] = 10.0
    #: Messages queued per subscriber before a slow one starts losing them.
    send_hwm: Annotated[int, Num(10, 10_000_000)] = 10_000


@dataclass(frozen=True)
class AggregationSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Lower edges of the buckets host counts are reported in.
    host_buckets: Edges = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
    #: Lower edges of the buckets GPU counts are reported in.
    gpu_buckets: Edges = (0, 1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 32768)

    def __post_init__(self) -> None:
        for name in ("host_buckets", "gpu_buckets"):
            edges = getattr(self, name)
            if edges[0] != 0 or any(b <= a for a, b in itertools.pairwise(edges)):
                raise ValueError(f"{name} must start at 0 and increase strictly")


@dataclass(frozen=True)
class ControllerConfig:
    STRICT_KEYS: ClassVar[bool] = True
    controller: ControllerSection = field(default_factory=ControllerSection)
    liveness: LivenessSection = field(default_factory=LivenessSection)
    feed: FeedSection = field(default_factory=FeedSection)
    aggregation: AggregationSection = field(default_factory=AggregationSection)


def load(path: Path | None = None) -> tuple[ControllerConfig, Path | None]:
    return config.load(ControllerConfig, path, default=DEFAULT_PATH)
