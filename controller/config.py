"""The controller's configuration (``/etc/harmonaize/controller.toml``) with its defaults."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar

from controller.agreementstate import AgreementSettings
from controller.redactionconfig import RedactionConfig
from harmonaize import config
from harmonaize.config import (
    AbsPath,
    Endpoint,
    ListenAddress,
    LogLevel,
    MetricsSection,
    OptionalPath,
    split_address,
)
from harmonaize.maintenancetables import URGENCY, Urgency, ValidationCause
from harmonaize.schema import Ident, Len, Name, Num, Str

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
    #: Users (besides root) who may run ``place`` and ``unplace`` on the admin socket:
    #: the scheduler's hook's (Slurm's SlurmUser). They open the socket as members of
    #: admin_group.
    scheduler_users: Annotated[tuple[Ident, ...], Len(16)] = ()
    database: AbsPath = "/var/lib/harmonaize/controller.db"
    log_level: LogLevel = LogLevel.INFO
    #: Seconds between tries to write again while the database's disk is full (writing
    #: and acknowledgements pause meanwhile; reads go on).
    full_disk_retry: Annotated[float, Num(0.1, 3600.0)] = 5.0


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
class PoolsSection:
    """``[pools]``: the pool and GPU-class names tenants may see (in topics
    ``pool/<pool>/<class>`` and in capacity messages). A host's names come from its agent;
    only names listed here reach a tenant, and as the controller's own strings. A host
    reporting another name is left out of every tenant's capacity (its jobs' health
    still counts it), counted and logged once per name. None are listed by default:
    the operator declares each pool and class (and reloads) before tenants see it."""

    STRICT_KEYS: ClassVar[bool] = True
    names: Annotated[tuple[Ident, ...], Len(4096)] = ()
    gpu_classes: Annotated[tuple[Ident, ...], Len(4096)] = ()


@dataclass(frozen=True)
class NoticesSection:
    """``[notices]``: how many validation notices the controller keeps (each is stored
    until an hour after its pause could have ended). A host's notice beyond either
    bound is not passed on: counted and logged, the host's own plan goes on."""

    STRICT_KEYS: ClassVar[bool] = True
    per_host: Annotated[int, Num(1, 100_000)] = 256
    per_job: Annotated[int, Num(1, 100_000)] = 64


Origin = Annotated[str, Str(max_len=256, pattern=r"https?://[A-Za-z0-9.\[\]:-]+",
                            expected="an origin: http(s)://HOST[:PORT]")]


@dataclass(frozen=True)
class GatewaySection:
    """``[gateway]``: the tenant feed over HTTP (docs/wire.md)."""

    STRICT_KEYS: ClassVar[bool] = True
    #: HOST:PORT the HTTP gateway listens on, e.g. "0.0.0.0:7443"; empty: no gateway.
    listen: ListenAddress = ""
    #: PEM certificate chain and its key, to serve HTTPS; empty: plain HTTP (only behind
    #: a proxy that terminates TLS, or on loopback).
    tls_cert: OptionalPath = ""
    tls_key: OptionalPath = ""
    #: PEM bundle of the CA whose client certificates are accepted (the subject's common
    #: name is the tenant); empty: tokens only. Needs tls_cert.
    client_ca: OptionalPath = ""
    #: Origins whose pages may read the feed and send requests with their credentials
    #: (browser dashboards); none by default.
    cors_origins: Annotated[tuple[Origin, ...], Len(64)] = ()
    #: The ``source`` of every CloudEvent the gateway sends.
    source: Annotated[str, Str(max_len=256, min_len=1)] = "/harmonaize/feed"
    #: Seconds between keep-alive comments on a quiet stream (proxies drop idle ones).
    keepalive: Annotated[float, Num(1.0, 300.0)] = 15.0
    #: Streams open at once, over all tenants and per tenant.
    max_streams: Annotated[int, Num(1, 100_000)] = 1000
    streams_per_tenant: Annotated[int, Num(1, 10_000)] = 16
    #: Seconds a new connection has to send its first request's headers in full (and to
    #: finish a TLS handshake); then it is closed. Slow or silent ones hold descriptors.
    header_timeout: Annotated[float, Num(0.5, 300.0)] = 10.0
    #: Seconds a kept-alive connection may wait for its next request's headers in full.
    idle_timeout: Annotated[float, Num(1.0, 3600.0)] = 60.0
    #: Seconds a request's body has to arrive in full once its headers did.
    body_timeout: Annotated[float, Num(0.5, 600.0)] = 30.0
    #: Connections open at once, over all clients and per client address; the excess is
    #: closed as it is accepted, and counted.
    max_connections: Annotated[int, Num(1, 1_000_000)] = 4096
    connections_per_address: Annotated[int, Num(1, 1_000_000)] = 256
    #: Seconds a browser session (POST /v1/session) lasts, and sessions kept per tenant
    #: (one more ends the tenant's oldest).
    session_lifetime: Annotated[float, Num(60.0, 30 * 86400.0)] = 8 * 3600.0
    sessions_per_tenant: Annotated[int, Num(1, 10_000)] = 16

    def __post_init__(self) -> None:
        if self.listen and split_address(self.listen)[1] == 0:
            raise ValueError("listen needs a port from 1 to 65535")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("tls_cert and tls_key go together")
        if self.client_ca and not self.tls_cert:
            raise ValueError("client_ca needs tls_cert (client certificates need TLS)")


NatsUrl = Annotated[str, Str(max_len=256, pattern=r"(nats|tls)://[A-Za-z0-9_.\[\]:-]+:[0-9]{1,5}",
                             expected="a NATS URL: nats://HOST:PORT or tls://HOST:PORT")]


@dataclass(frozen=True)
class ClusterSection:
    """``[cluster]``: this controller as one replica of several over NATS JetStream
    (docs/scaling.md). Off (the default): one controller, SQLite, nothing else to run."""

    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = False
    #: This replica's name, unique in the cluster (shown in status; holds the leases).
    replica: Name = ""
    #: NATS servers of the JetStream cluster (any of them; the client finds the rest).
    servers: Annotated[tuple[NatsUrl, ...], Len(32, min_len=1)] = ("nats://127.0.0.1:4222",)
    #: A NATS credentials file (an account's user JWT and nkey seed), or ...
    credentials: OptionalPath = ""
    #: ... an nkey seed file whose public key the servers know; empty: neither.
    nkey: OptionalPath = ""
    #: Copies JetStream keeps of each stream and bucket (3 for a three-node cluster).
    stream_replicas: Annotated[int, Num(1, 5)] = 3
    #: Seconds the leader's lease, and a replica's presence, last without renewal: about
    #: the longest the feed stands still when the leader dies.
    lease: Annotated[float, Num(0.5, 60.0)] = 2.0
    #: Seconds the agents' and the feed's streams keep messages (a replica down longer
    #: begins its tenants' feed from what is left; the leader's log is kept whole).
    retention: Annotated[float, Num(3600.0, 365 * 86400.0)] = 7 * 86400.0
    #: Seconds between the leader's snapshots of its state (a new leader reads the last
    #: one and the commits after it).
    snapshot_interval: Annotated[float, Num(1.0, 86400.0)] = 60.0
    #: Whether a replica that is not leading keeps the leader's state as it is written,
    #: so that taking over reads only the commits since (controller/bus/standby.py):
    #: a takeover in well under a second at 100,000 hosts, for about a tenth of a core
    #: per replica at that size. Off: a takeover reads the newest snapshot and the log.
    warm_standby: bool = True

    def __post_init__(self) -> None:
        if self.enabled and not self.replica:
            raise ValueError("replica: a cluster replica needs a name")


class SchedulerBackendName(StrEnum):
    NONE = "none"
    SLURM = "slurm"


class SchedulerMode(StrEnum):
    SHADOW = "shadow"  # log what would be done, do nothing
    ACT = "act"


@dataclass(frozen=True)
class SchedulerSection:
    """``[scheduler]``: hosts' holds drained and resumed in the provider's scheduler
    (docs/operator-guide.md, "Slurm: drains and resumes"). Off by default; once on, in
    shadow mode until the operator sets ``mode = "act"``."""

    STRICT_KEYS: ClassVar[bool] = True
    backend: SchedulerBackendName = SchedulerBackendName.NONE
    mode: SchedulerMode = SchedulerMode.SHADOW
    #: At most this share of a partition's nodes out of service at once, counting
    #: nodes drained or down by anyone (the circuit breaker).
    max_share: Annotated[float, Num(0.0, 1.0)] = 0.2
    #: Host id -> scheduler node name, where they differ (identity otherwise).
    node_map: Annotated[dict[Ident, Ident], Len(1_000_000)] = field(default_factory=dict)
    scontrol: AbsPath = "/usr/bin/scontrol"
    #: Seconds one scontrol call may take before it is killed and counted as failed.
    timeout: Annotated[float, Num(0.1, 300.0)] = 10.0
    #: Seconds between reads of every node's state when no hold changed.
    reconcile: Annotated[float, Num(1.0, 3600.0)] = 30.0
    #: Minutes a maintenance reservation for a validation lasts at most.
    reservation_minutes: Annotated[int, Num(1, 7 * 24 * 60)] = 120


@dataclass(frozen=True)
class JobHealthSection:
    """``[jobhealth]``: how the controller judges a job's progress across its hosts
    (harmonaize/progress.py; docs/operator-guide.md) and how much it keeps of it."""

    STRICT_KEYS: ClassVar[bool] = True
    #: Seconds with no rank moving, at unequal counts, before a hang is named.
    hang_after: Annotated[float, Num(0.1, 3600.0)] = 3.0
    #: Seconds with every rank stopped at the same collective before a stall is named.
    stall_after: Annotated[float, Num(0.1, 86_400.0)] = 60.0
    straggler_margin: Annotated[float, Num(0.1, 3600.0)] = 2.0
    straggler_window: Annotated[float, Num(0.1, 86_400.0)] = 30.0
    #: Communicators kept per job (a job making more is counted, the rest dropped).
    comms_per_job: Annotated[int, Num(1, 4096)] = 64
    #: Hosts' reports kept per communicator.
    hosts_per_comm: Annotated[int, Num(1, 100_000)] = 1024
    #: Findings and withdrawals kept for operators (harmonctl -C job-findings).
    history: Annotated[int, Num(0, 100_000)] = 1000

    def __post_init__(self) -> None:
        if self.stall_after < self.hang_after:
            raise ValueError("stall_after must be at least hang_after")


@dataclass(frozen=True)
class NegotiationSection:
    """``[negotiation]``: who may negotiate capacity and with what weight (a tenant's
    share of a pool's released free GPUs is its weight over all weights, at most
    ``max_share``), and how long an offer stands (docs/tenant-guide.md, "Negotiating
    capacity and maintenance"). No weights: nobody negotiates."""

    STRICT_KEYS: ClassVar[bool] = True
    weights: Annotated[dict[Ident, Annotated[float, Num(0.0, 1e6)]], Len(4096)] = field(
        default_factory=dict)
    max_share: Annotated[float, Num(0.01, 1.0)] = 0.5
    offer_ttl: Annotated[float, Num(1.0, 86_400.0)] = 120.0
    #: Per condition behind a validation (gpu-fault, ...): how long its maintenance
    #: window may wait at most (only shorter than the built-in bound: a host refuses a
    #: later start), and how much notice a tenant gets at least (docs/operator-guide.md).
    most_wait: Annotated[dict[Ident, Annotated[float, Num(1.0, 604_800.0)]], Len(16)] = field(
        default_factory=dict)
    least_notice: Annotated[dict[Ident, Annotated[float, Num(0.0, 86_400.0)]], Len(16)] = (
        field(default_factory=dict))

    def __post_init__(self) -> None:
        known = {c.value for c in ValidationCause}
        for name, table in (("most_wait", self.most_wait), ("least_notice", self.least_notice)):
            if unknown := sorted(set(table) - known):
                raise ValueError(f"{name}: no condition {unknown[0]!r} (one of "
                                 f"{', '.join(sorted(known))})")
        for cause, wait in self.most_wait.items():
            if wait > URGENCY[ValidationCause(cause)].most_wait:
                raise ValueError(f"most_wait.{cause}: {wait:g} s is above the built-in "
                                 f"{URGENCY[ValidationCause(cause)].most_wait:g} s")

    def urgency(self) -> dict[ValidationCause, Urgency]:
        """The bounds per condition, the table's with this section's changes."""
        return {c: Urgency(self.most_wait.get(c.value, u.most_wait),
                           self.least_notice.get(c.value, u.least_notice))
                for c, u in URGENCY.items()}


@dataclass(frozen=True)
class ControllerConfig:
    STRICT_KEYS: ClassVar[bool] = True
    controller: ControllerSection = field(default_factory=ControllerSection)
    liveness: LivenessSection = field(default_factory=LivenessSection)
    feed: FeedSection = field(default_factory=FeedSection)
    redaction: RedactionConfig = field(default_factory=RedactionConfig)
    auth: AuthSection = field(default_factory=AuthSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    gateway: GatewaySection = field(default_factory=GatewaySection)
    cluster: ClusterSection = field(default_factory=ClusterSection)
    #: Multi-host tuning: how the controller agrees changes with a job's hosts.
    tuning: AgreementSettings = field(default_factory=AgreementSettings)
    pools: PoolsSection = field(default_factory=PoolsSection)
    notices: NoticesSection = field(default_factory=NoticesSection)
    scheduler: SchedulerSection = field(default_factory=SchedulerSection)
    jobhealth: JobHealthSection = field(default_factory=JobHealthSection)
    negotiation: NegotiationSection = field(default_factory=NegotiationSection)


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
        ("controller.scheduler_users", old.controller.scheduler_users,
         new.controller.scheduler_users),
        ("controller.database", old.controller.database, new.controller.database),
        ("feed.send_hwm", old.feed.send_hwm, new.feed.send_hwm),
        ("feed.socket_buffer", old.feed.socket_buffer, new.feed.socket_buffer),
        ("auth", old.auth, new.auth),
        ("metrics", old.metrics, new.metrics),
        ("gateway", old.gateway, new.gateway),
        ("cluster", old.cluster, new.cluster),
        ("scheduler.backend", old.scheduler.backend, new.scheduler.backend),
        ("scheduler.scontrol", old.scheduler.scontrol, new.scheduler.scontrol),
    ) if before != after]
    running = dataclasses.replace(
        new, controller=dataclasses.replace(old.controller, log_level=new.controller.log_level,
                                            full_disk_retry=new.controller.full_disk_retry),
        feed=dataclasses.replace(new.feed, send_hwm=old.feed.send_hwm,
                                 socket_buffer=old.feed.socket_buffer),
        auth=old.auth, metrics=old.metrics, gateway=old.gateway, cluster=old.cluster,
        scheduler=dataclasses.replace(new.scheduler, backend=old.scheduler.backend,
                                      scontrol=old.scheduler.scontrol))
    return running, later
