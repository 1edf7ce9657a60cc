"""Proactive validation's settings (``[validation]``): its checks and their limits."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, ClassVar

from agent.conditions import Action
from harmonaize.schema import Fraction, Ident, Len, Name, Num, Str

Level = Annotated[int, Num(1, 3)]


class ParserName(StrEnum):
    EXIT_CODE = "exit-code"    # exit status 0 passes
    METRICS = "metrics"        # lines "metric NAME VALUE [UNIT]", judged against baselines
    NCCL_TESTS = "nccl-tests"  # all_reduce_perf's "Avg bus bandwidth"
    DCGMI_JSON = "dcgmi-json"  # dcgmi diag -j


class Scope(StrEnum):
    GPU = "gpu"    # once per validated GPU, {gpu} in the command is its index
    HOST = "host"  # once for the host


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
