"""The agent's configuration (``/etc/harmonaize/agent.toml``) with its defaults.

Every field has a default, so the agent runs with no file at all. Unknown keys
and values of the wrong type are rejected with the key named.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Annotated, ClassVar

from agent.gpu.actions import Action
from agent.rdma.ccparams import PARAMS, CcParam
from harmonaize import config
from harmonaize.config import AbsPath, Endpoint, LogLevel, MetricsSection, OptionalPath
from harmonaize.schema import Fraction, Ident, Len, Name, Num, Str

DEFAULT_PATH = Path("/etc/harmonaize/agent.toml")
#: A Slurm job's cgroup where slurmd makes it, v1 (``/slurm[_<node>]/uid_<u>/job_<id>/...``)
#: or v2 (``/system.slice/[<node>_]slurmstepd.scope/job_<id>/...``). Anchored at the root:
#: a tenant may own a delegated subtree (systemd's ``user@<uid>.service``) and name a
#: cgroup ``job_<id>`` there, but cannot make one under root's ``slurm`` or ``system.slice``.
SLURM_JOB_CGROUP = (r"^(?:/slurm(?:_[^/]+)?/uid_[0-9]+"
                    r"|/system\.slice/(?:[^/]+_)?slurmstepd\.scope)/job_(?P<job>[0-9]+)(?:/|$)")


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


@dataclass(frozen=True)
class HostObserverSection:
    STRICT_KEYS: ClassVar[bool] = True
    #: Rules' settings: a reload applies them to the running engine (see live_changes).
    LIVE: ClassVar[frozenset[str]] = frozenset({"memory_available_min", "sustain"})
    enabled: bool = True
    #: Seconds between reads of CPU, memory and load (slower than the loop: they move slowly).
    interval: Annotated[float, Num(0.01, 3600.0)] = 1.0
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


@dataclass(frozen=True)
class RdmaSection:
    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    sysfs_root: AbsPath = "/sys"
    #: Class of each RDMA port ("mlx5_0/1") or its net device; default "data".
    link_classes: dict[Name, Ident] = field(default_factory=dict)


class CcLayout(StrEnum):
    AUTO = "auto"        # MLNX_OFED's sysfs tree where a port has it, else upstream debugfs
    SYSFS = "sysfs"      # /sys/class/net/<if>/ecn/roce_{rp,np}/ (MLNX_OFED)
    DEBUGFS = "debugfs"  # <debugfs>/mlx5/<pci>/cc_params/ (upstream mlx5)


class Switch(StrEnum):
    """What the loop may do with a per-priority enable flag."""

    KEEP = "keep"  # never touch it
    ON = "on"      # set it, and keep it, on
    OFF = "off"    # set it, and keep it, off
    AUTO = "auto"  # turn it on once the counters show it is missing (never off)


#: ``[lo, hi]``: the values the loop may set a parameter to (equal ends pin it).
Bound = Annotated[tuple[Annotated[int, Num(0, 2**32 - 1)], ...], Len(2, min_len=2)]


@dataclass(frozen=True)
class CcDeviceSection:
    """One RoCE NIC's ranges: ``[[rdma.cc.devices]]``."""

    STRICT_KEYS: ClassVar[bool] = True
    #: The port's net device (``eth2``) or RDMA device (``mlx5_0``).
    device: Ident
    #: Priorities whose reaction and notification point enable flags the loop may set.
    priorities: Annotated[tuple[Annotated[int, Num(0, 7)], ...], Len(8)] = ()
    rp_enable: Switch = Switch.KEEP
    np_enable: Switch = Switch.KEEP
    #: DCQCN parameter (MLNX_OFED's name) -> [lo, hi]; parameters not named are never set.
    ranges: dict[CcParam, Bound] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(set(self.priorities)) != len(self.priorities):
            raise ValueError(f"{self.device}: priorities: {list(self.priorities)} repeats one")
        for point, switch in (("rp_enable", self.rp_enable), ("np_enable", self.np_enable)):
            if switch is not Switch.KEEP and not self.priorities:
                raise ValueError(f"{self.device}: {point} = \"{switch.value}\" needs priorities")
        for name, (lo, hi) in self.ranges.items():
            param = PARAMS[name]
            if lo > hi:
                raise ValueError(f"{self.device}: ranges.{name}: [{lo}, {hi}]: the lower "
                                 "end is above the upper")
            if lo < param.lo or hi > param.hi:
                raise ValueError(f"{self.device}: ranges.{name}: [{lo}, {hi}] leaves what the "
                                 f"NIC takes, {param.lo}..{param.hi} {param.unit}")


@dataclass(frozen=True)
class RdmaCcSection:
    """DCQCN/ECN congestion control inside the operator's ranges: ``[rdma.cc]``."""

    STRICT_KEYS: ClassVar[bool] = True
    #: Opt-in: nothing on a NIC is changed unless this is true.
    enabled: bool = False
    layout: CcLayout = CcLayout.AUTO
    #: Where upstream mlx5's ``mlx5/<pci>/cc_params`` is (sysfs: observers.rdma.sysfs_root).
    debugfs_root: AbsPath = "/sys/kernel/debug"
    #: Seconds of counters judged together (one decision per device at most per window).
    window: Annotated[float, Num(0.1, 3600.0)] = 1.0
    #: Seconds without loss, throttled and below utilization_target, before a step
    #: towards faster recovery; also the least time between two such steps.
    hold: Annotated[float, Num(0.0, 86400.0)] = 30.0
    #: Decisions per device and minute, at most (a decision may set several values).
    max_changes_per_minute: Annotated[int, Num(1, 600)] = 2
    #: Lost packets (out of sequence, retransmitted, timed out) per packet: at or above
    #: loss_high a step towards a more cautious sender; only at or below loss_low may
    #: the loop step the other way.
    loss_low: Fraction = 0.00001
    loss_high: Fraction = 0.0001
    #: CNPs handled per packet sent at which the port's senders count as throttled.
    cnp_low: Fraction = 0.001
    #: Throttled senders below this utilization of the port recover too slowly.
    utilization_target: Fraction = 0.9
    #: Windows with fewer packets (both directions) are not judged.
    min_packets: Annotated[int, Num(0, 2**40)] = 10_000
    #: Levels between the cautious and the fast end of each steered range.
    steps: Annotated[int, Num(1, 64)] = 8
    devices: Annotated[tuple[CcDeviceSection, ...], Len(64)] = ()

    def __post_init__(self) -> None:
        if not self.loss_low <= self.loss_high:
            raise ValueError("cc: loss_low must not exceed loss_high")
        names = [d.device for d in self.devices]
        if len(set(names)) != len(names):
            raise ValueError(f"cc: devices: {sorted(names)} names a device twice")


@dataclass(frozen=True)
class RdmaControlSection:
    """``[rdma]``: what the agent may change on RDMA NICs (observing is [observers.rdma])."""

    STRICT_KEYS: ClassVar[bool] = True
    cc: RdmaCcSection = field(default_factory=RdmaCcSection)


EnvName = Annotated[str, Str(max_len=64, min_len=1, pattern=r"[A-Za-z_][A-Za-z0-9_]*")]


@dataclass(frozen=True)
class GpuObserverSection:
    STRICT_KEYS: ClassVar[bool] = True
    LIVE: ClassVar[frozenset[str]] = frozenset({
        "sbe_per_minute", "pcie_replays_per_minute", "nvlink_crc_per_second",
        "nvlink_replays_per_minute", "retired_pages_limit", "slowdown_sustain",
        "busy_utilization", "xid_hold", "suspect_clear", "advisory_interval"})
    enabled: bool = True
    #: A specific libnvidia-ml.so.1 (tests and the demo use a fake); empty: the driver's.
    nvml_library: Annotated[str, Str(max_len=4096, pattern=r"/.*")] = ""
    #: Seconds after which a GPU stuck in an NVML call counts as unresponsive.
    call_timeout: Annotated[float, Num(0.05, 600.0)] = 2.0
    #: Seconds between reads of the error counters (ECC, remapping, PCIe, NVLink). An
    #: XID, ECC or page retirement event triggers a read at once, whatever this says.
    counter_interval: Annotated[float, Num(0.01, 3600.0)] = 1.0
    #: Seconds between reads of temperature, power, clocks, PCIe link and processes.
    slow_interval: Annotated[float, Num(0.05, 3600.0)] = 1.0
    #: Seconds the event thread waits in nvmlEventSetWait_v2 per call (events end the
    #: wait at once; this only bounds how long stopping takes).
    event_wait: Annotated[float, Num(0.01, 60.0)] = 1.0
    procfs_root: AbsPath = "/proc"
    #: Environment variable the provider's scheduler sets to a process's job id: a hint
    #: only, which the process's cgroup or its holding the job's Unix group must back.
    job_env: EnvName = "HARMONAIZE_JOB"
    #: A regular expression with a group named "job" over the process's cgroup path:
    #: where it matches, the cgroup names the job. The default is Slurm's (proctrack or
    #: task/cgroup): "job_<id>" as a whole path component, in cgroup v1's
    #: /slurm[_<node>]/uid_<u>/job_<id>/step_<n> and v2's .../job_<id>/step_<n>/...;
    #: "" turns it off.
    job_cgroup_pattern: Annotated[str, Str(max_len=512)] = SLURM_JOB_CGROUP
    #: Launcher variables that name a process's rank, in the tenant's terms.
    rank_env: Annotated[tuple[EnvName, ...], Len(16)] = (
        "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")
    #: Volatile single-bit ECC errors within a minute that make a GPU suspect.
    sbe_per_minute: Annotated[float, Num(1.0, 1e9)] = 60.0
    #: PCIe replays within a minute that make a GPU suspect, at PCIe gen 3; the
    #: allowance doubles with each generation above (faster links replay more).
    pcie_replays_per_minute: Annotated[float, Num(1.0, 1e9)] = 8.0
    #: NVLink CRC errors (flit and data) per second, over 10 s, that make a GPU suspect.
    nvlink_crc_per_second: Annotated[float, Num(1.0, 1e9)] = 100.0
    #: NVLink replays within a minute that make a GPU suspect (any recovery does).
    nvlink_replays_per_minute: Annotated[float, Num(1.0, 1e9)] = 60.0
    #: Retired pages at which a GPU is quarantined for RMA.
    retired_pages_limit: Annotated[int, Num(1, 1_000_000)] = 60
    #: Seconds of thermal or power slowdown before a GPU is suspect.
    slowdown_sustain: Annotated[float, Num(0.0, 3600.0)] = 10.0
    #: The PCIe generation counts as degraded only above this utilization (%):
    #: idle GPUs lower their link generation to save power.
    busy_utilization: Annotated[int, Num(0, 100)] = 10
    #: Seconds an XID keeps its condition after it was last seen.
    xid_hold: Annotated[float, Num(0.0, 86400.0)] = 300.0
    #: Seconds without suspect signals before a suspect GPU is healthy again.
    suspect_clear: Annotated[float, Num(0.0, 86400.0)] = 600.0
    #: At most one checkpoint advisory per job in this many seconds, unless it gets worse.
    advisory_interval: Annotated[float, Num(0.0, 86400.0)] = 60.0

    def __post_init__(self) -> None:
        if self.job_cgroup_pattern:
            try:
                pattern = re.compile(self.job_cgroup_pattern)
            except re.error as exc:
                raise ValueError(f"job_cgroup_pattern is not a regular expression: {exc}") \
                    from None
            if "job" not in pattern.groupindex:
                raise ValueError("job_cgroup_pattern needs a group named job: (?P<job>...)")


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


class ParserName(StrEnum):
    EXIT_CODE = "exit-code"    # exit status 0 passes
    METRICS = "metrics"        # lines "metric NAME VALUE [UNIT]", judged against baselines
    NCCL_TESTS = "nccl-tests"  # all_reduce_perf's "Avg bus bandwidth"
    DCGMI_JSON = "dcgmi-json"  # dcgmi diag -j


class Scope(StrEnum):
    GPU = "gpu"    # once per validated GPU, {gpu} in the command is its index
    HOST = "host"  # once for the host


Level = Annotated[int, Num(1, 3)]


@dataclass(frozen=True)
class CommandSection:
    """An operator-configured check, e.g. ``dcgmi diag -r {level} -i {gpu} -j``."""

    STRICT_KEYS: ClassVar[bool] = True
    name: Ident
    command: Annotated[tuple[Annotated[str, Str(max_len=1024, min_len=1)], ...],
                       Len(64, min_len=1)]
    parser: ParserName = ParserName.EXIT_CODE
    #: Validation levels (1 quick, 2 minutes, 3 long) that include this check.
    levels: Annotated[tuple[Level, ...], Len(3, min_len=1)] = (2, 3)
    #: Seconds before it is killed and counted as failed.
    budget: Annotated[float, Num(0.1, 86400.0)] = 120.0
    scope: Scope = Scope.GPU
    #: Fixed baselines by measurement name; the others are learned from passing runs.
    baselines: dict[Name, Annotated[float, Num(0.0, 1e15)]] = field(default_factory=dict)
    #: What to recommend when it fails.
    on_fail: Action = Action.RESET_GPU


@dataclass(frozen=True)
class NetworkCheckSection:
    """iperf3 bandwidth to a peer over the data interface, judged against a baseline."""

    STRICT_KEYS: ClassVar[bool] = True
    #: Peer address (its agent serves iperf3 with serve = true); empty: no network check.
    peer: Annotated[str, Str(max_len=255, pattern=r"[A-Za-z0-9.:_-]+")] = ""
    port: Annotated[int, Num(1, 65535)] = 5201
    seconds: Annotated[float, Num(1.0, 600.0)] = 5.0
    #: Expected Gb/s; 0 learns it from this host's earlier passing runs.
    baseline_gbps: Annotated[float, Num(0.0, 1e6)] = 0.0
    levels: Annotated[tuple[Level, ...], Len(3, min_len=1)] = (2, 3)
    #: Run an iperf3 server on ``port`` for peers to measure against.
    serve: bool = False


@dataclass(frozen=True)
class ValidationSection:
    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    #: Level run on a suspect GPU, after a repair, and on schedule.
    suspect_level: Level = 2
    #: Seconds between two validations of one device (operators are exempt).
    cooldown: Annotated[float, Num(0.0, 30 * 86400.0)] = 1800.0
    #: Validate idle healthy GPUs this often (seconds); 0 never.
    schedule_interval: Annotated[float, Num(0.0, 365 * 86400.0)] = 0.0
    max_parallel: Annotated[int, Num(1, 64)] = 2
    #: Seconds between telling a tenant and pausing its GPU (only if its job allows it).
    notice_lead: Annotated[float, Num(0.0, 3600.0)] = 30.0
    #: A measurement this much worse than its baseline fails (SuperBench's 5%).
    tolerance: Fraction = 0.05
    history_keep: Annotated[int, Num(10, 10_000_000)] = 10_000
    commands: Annotated[tuple[CommandSection, ...], Len(64)] = ()
    network: NetworkCheckSection = field(default_factory=NetworkCheckSection)


@dataclass(frozen=True)
class TuningSection:
    """The micro-level loop: NCCL policies for declared jobs, and bulk traffic classes."""

    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    #: Policies for the NCCL tuner plugin (and each job's next-launch NCCL file) go here;
    #: the plugin reads HARMONAIZE_TUNER_DIR, default the same path.
    policy_dir: AbsPath = "/run/harmonaize/tuner"
    #: At most this many choice changes per job and minute.
    max_changes_per_minute: Annotated[int, Num(1, 600)] = 6
    #: Seconds a calmer link level must last before a job's choice steps down.
    hold: Annotated[float, Num(0.0, 3600.0)] = 5.0
    #: A change activates this many seconds of a communicator's collectives ahead ...
    activation_lead: Annotated[float, Num(0.0, 60.0)] = 0.5
    #: ... and at least this many collectives ahead.
    activation_margin: Annotated[int, Num(1, 1_000_000)] = 64
    #: Seconds between reports to the controller for a job spanning hosts (progress
    #: and switch records; a change is reported at once).
    report_interval: Annotated[float, Num(0.1, 3600.0)] = 1.0
    #: A communicator none of whose ranks is seen for this long is forgotten.
    stall: Annotated[float, Num(0.1, 3600.0)] = 10.0
    #: Link classes whose congestion drives the choice.
    link_classes: Annotated[tuple[Ident, ...], Len(16, min_len=1)] = ("data",)
    #: Keep collectives ahead of declared bulk traffic with HTB on these link classes.
    htb: bool = True
    htb_link_classes: Annotated[tuple[Ident, ...], Len(16)] = ("data",)
    #: Share of a shaped link the collectives keep however large the bulk floors.
    collective_share: Annotated[float, Num(0.01, 1.0)] = 0.1
    #: Share of a shaped link one job's bulk floor may keep at most, whatever it declares
    #: (the floors also share what the collectives leave max-min fairly).
    bulk_floor_max_share: Annotated[float, Num(0.001, 1.0)] = 0.5
    #: NCCL_IB_TC recommended for the next launch (the fabric's class for
    #: collectives); -1: none.
    ib_traffic_class: Annotated[int, Num(-1, 255)] = -1
    #: Next-launch recommendations for congestion once a job was congested this share
    #: of the time.
    congested_share: Fraction = 0.2
    #: Seconds after a start before files of jobs nobody declared again are removed.
    orphan_grace: Annotated[float, Num(0.0, 86400.0)] = 60.0
    #: A job's stats files (the plugin writes one per rank process) considered at most;
    #: more are counted (``harmonctl jobs``) and ignored ...
    stats_files_per_job: Annotated[int, Num(1, 4096)] = 256
    #: ... and at most this many of one uid (a file admitted once stays admitted).
    stats_files_per_uid: Annotated[int, Num(1, 4096)] = 64
    #: Stats files of a job read per look at most; the others in turn at the next looks.
    stats_files_per_pass: Annotated[int, Num(1, 4096)] = 32
    #: Reads of a stats file whose slot stays mid-update before the slot counts as stale
    #: (no waiting between them).
    stats_seqlock_tries: Annotated[int, Num(1, 64)] = 4


@dataclass(frozen=True)
class EnergySection:
    """GPU power limits inside the slowdown a job declares (agent/gpu/energy.py)."""

    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = True
    #: Seconds between two looks of the loop (it also looks when a deadline of its own comes).
    interval: Annotated[float, Num(0.05, 60.0)] = 1.0
    #: A step lowers a GPU's limit by this share of the limit it had before.
    step: Annotated[float, Num(0.01, 0.5)] = 0.05
    #: Seconds after a change before its effect is measured (clocks and the job settle).
    settle: Annotated[float, Num(0.0, 600.0)] = 5.0
    #: Seconds of the job's progress per measurement, the baseline's too.
    window: Annotated[float, Num(0.05, 3600.0)] = 20.0
    #: Back off (raise the limit) once the measured slowdown reaches this share of the
    #: job's declared max_slowdown ...
    backoff_at: Fraction = 0.8
    #: ... and lower further only while it is below this share (between: hold).
    probe_below: Fraction = 0.5
    #: Seconds at a settled limit before trying lower again.
    hold: Annotated[float, Num(0.0, 86400.0)] = 300.0
    #: Seconds after which the job's progress at its GPUs' own limits is measured again
    #: (its work may have changed); 0: never.
    rebaseline: Annotated[float, Num(0.0, 7 * 86400.0)] = 3600.0
    #: Lowerings per GPU and minute at most (a raise back toward the GPU's own limit, and
    #: a restore, are never held back).
    max_changes_per_minute: Annotated[int, Num(1, 600)] = 4
    #: Operator bounds: never below this share of a GPU's default limit ...
    min_share: Fraction = 0.5
    #: ... nor below this many watts (0: no floor of its own).
    min_watts: Annotated[float, Num(0.0, 100_000.0)] = 0.0
    #: A rank whose collectives are ahead of the slowest local rank's in at least this
    #: share of a window's looks waits on the others: its GPU is lowered first.
    waiting_share: Fraction = 0.6
    #: Seconds between reports of each job's energy to the controller.
    report_interval: Annotated[float, Num(1.0, 86400.0)] = 60.0

    def __post_init__(self) -> None:
        if self.probe_below > self.backoff_at:
            raise ValueError("probe_below must not exceed backoff_at")


class RemediationMode(StrEnum):
    SHADOW = "shadow"  # log what would be done, do nothing
    ACT = "act"


@dataclass(frozen=True)
class RemediationSection:
    """Resets of quarantined GPUs, and the reboot and RMA holds after them
    (agent/remediation); needs validation, which decides after each step."""

    STRICT_KEYS: ClassVar[bool] = True
    enabled: bool = False
    mode: RemediationMode = RemediationMode.SHADOW
    #: The reset command; {gpu} is the GPU's index, {pci_bus_id} its PCI bus id, {uuid}.
    #: NVML has no public reset call: nvidia-smi's is the driver's supported way.
    reset_command: Annotated[tuple[Annotated[str, Str(max_len=1024, min_len=1)], ...],
                             Len(64, min_len=1)] = (
        "nvidia-smi", "--gpu-reset", "-i", "{pci_bus_id}")
    #: Seconds before a reset command is killed and counted as failed.
    reset_timeout: Annotated[float, Num(1.0, 3600.0)] = 120.0
    #: Failed resets (the command failed, or validation failed after it) before the
    #: scheduler is asked to reboot the host.
    max_resets: Annotated[int, Num(1, 100)] = 2
    #: Seconds between two resets of one GPU at least.
    reset_interval: Annotated[float, Num(0.0, 7 * 86400.0)] = 600.0
    #: Resets on this host within any hour at most.
    max_resets_per_hour: Annotated[int, Num(1, 1000)] = 4
    #: Where the boot id is read: another id than at the reboot request means the host
    #: rebooted.
    boot_id_file: AbsPath = "/proc/sys/kernel/random/boot_id"

    def __post_init__(self) -> None:
        try:
            render_reset(self.reset_command, 0, "00000000:00:00.0", "GPU-0")
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(f"reset_command: unknown placeholder {exc} (use {{gpu}}, "
                             "{pci_bus_id} or {uuid})") from None


def render_reset(argv: tuple[str, ...], gpu: int, pci_bus_id: str, uuid: str) -> list[str]:
    values = {"gpu": str(gpu), "pci_bus_id": pci_bus_id, "uuid": uuid}
    return [part.format_map(values) for part in argv]


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
    metrics: MetricsSection = field(default_factory=MetricsSection)


def load(path: Path | None = None) -> tuple[AgentConfig, Path | None]:
    return config.load(AgentConfig, path, default=DEFAULT_PATH)
