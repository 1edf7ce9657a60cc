"""The controller's configuration (``/etc/harmonaize/controller.toml``) with its defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar

from controller.agreement import AgreementSettings
from controller.redaction import RedactionConfig
from harmonaize import config
from harmonaize.config import AbsPath, Endpoint, LogLevel, MetricsSection
from harmonaize.schema import Name, Num

DEFAULT_PATH = Path("/etc/harmonaize/controller.toml")

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
    #: Seconds between liveness checks at the least: a check comes when a host may have
    #: gone silent, and again this long after one that found a host at its very limit.
    check_interval: Annotated[float, Num(0.05, 60.0)] = 0.25


@dataclass(frozen=True)
class FeedSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Seconds between full republications of every condition on the feed.
    republish: Annotated[float, Num(0.5, 3600.0)] = 10.0
    #: Messages queued per subscriber before a slow one starts losing them.
    send_hwm: Annotated[int, Num(10, 10_000_000)] = 10_000
    #: Kernel send buffer per subscriber, bytes (caps what a stalled one pins in the
    #: kernel beyond send_hwm); 0 leaves the kernel's autotuning.
    socket_buffer: Annotated[int, Num(0, 64 * 1024 * 1024)] = 0
    #: Messages kept per topic for tenants that resume or saw a gap.
    retention: Annotated[int, Num(1, 1_000_000)] = 1000
    #: Seconds within which a tenant must renew its subscription (clients do it at a third).
    renew: Annotated[float, Num(1.0, 3600.0)] = 30.0
    #: Requests (subscriptions, renewals, declarations) per second per tenant, and how
    #: many may be saved up; beyond, requests are dropped and counted.
    request_rate: Annotated[float, Num(0.1, 100_000.0)] = 20.0
    request_burst: Annotated[float, Num(1.0, 1_000_000.0)] = 100.0
    #: Retained messages replayed per second per tenant, and how many may be saved up;
    #: beyond, a replay waits (the client asks again) and is counted.
    replay_rate: Annotated[float, Num(1.0, 10_000_000.0)] = 2000.0
    replay_burst: Annotated[float, Num(1.0, 100_000_000.0)] = 10000.0


class AuthMode(StrEnum):
    CURVE = "curve"  # agents and tenants authenticate with CurveZMQ keys
    NONE = "none"    # no authentication: pool topics only, no job topics or requests


@dataclass(frozen=True)
class AuthSection:
    STRICT_KEYS: ClassVar[bool] = True
    mode: AuthMode = AuthMode.CURVE
    #: controller.key_secret, agents/<host>.key and tenants/<tenant>.key live here.
    keys_dir: AbsPath = "/etc/harmonaize/keys"


@dataclass(frozen=True)
class ControllerConfig:
    STRICT_KEYS: ClassVar[bool] = True
    controller: ControllerSection = field(default_factory=ControllerSection)
    liveness: LivenessSection = field(default_factory=LivenessSection)
    feed: FeedSection = field(default_factory=FeedSection)
    redaction: RedactionConfig = field(default_factory=RedactionConfig)
    auth: AuthSection = field(default_factory=AuthSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    #: Multi-host tuning: how the controller agrees changes with a job's hosts.
    tuning: AgreementSettings = field(default_factory=AgreementSettings)


def load(path: Path | None = None) -> tuple[ControllerConfig, Path | None]:
    return config.load(ControllerConfig, path, default=DEFAULT_PATH)


def reloaded(old: ControllerConfig,
             new: ControllerConfig) -> tuple[ControllerConfig, list[str]]:
    """What a reload puts in force, and the settings whose change waits for a restart.

    Sockets, the database, keys and metrics keep their running values (so status
    shows what is in force); the rest applies at once.
    """
    later = [name for name, before, after in (
        ("controller.listen", old.controller.listen, new.controller.listen),
        ("controller.feed", old.controller.feed, new.controller.feed),
        ("controller.admin_socket", old.controller.admin_socket, new.controller.admin_socket),
        ("controller.admin_group", old.controller.admin_group, new.controller.admin_group),
        ("controller.database", old.controller.database, new.controller.database),
        ("feed.send_hwm", old.feed.send_hwm, new.feed.send_hwm),
        ("feed.socket_buffer", old.feed.socket_buffer, new.feed.socket_buffer),
        ("auth", old.auth, new.auth),
        ("metrics", old.metrics, new.metrics),
    ) if before != after]
    running = dataclasses.replace(
        new, controller=dataclasses.replace(old.controller, log_level=new.controller.log_level),
        feed=dataclasses.replace(new.feed, send_hwm=old.feed.send_hwm,
                                 socket_buffer=old.feed.socket_buffer),
        auth=old.auth, metrics=old.metrics)
    return running, later
