"""A small GPU 'plant' for the energy loop's tests: power limits, the cube-law curve of the
fake NVML (native/fake_nvml/power.c), and a job that goes at its slowest rank's pace."""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.energy.engine import (
    Action,
    EnergyGpu,
    EnergyLoop,
    EnergyObservation,
    PowerInfo,
    RankProgress,
    ReadPower,
    SetLimit,
)
from agent.plugin.layout import (
    FLAG_MAPPED,
    STATS_HEADER,
    STATS_HEADER_SIZE,
    STATS_MAGIC,
    STATS_SIZE,
    STATS_SLOTS,
    STATS_VERSION,
)
from harmonaize.messages import EnergyAllowance

W = 1000


@dataclass
class PlantGpu:
    index: int
    job: str | None = "job-1"
    original_mw: int = 700 * W
    min_mw: int = 200 * W
    max_mw: int = 700 * W
    default_mw: int = 700 * W
    demand_mw: int = 600 * W
    static_mw: int = 100 * W
    #: Work per second relative to the others (below 1: a straggler).
    speed: float = 1.0
    #: Share of the work the SM clock bounds.
    compute: float = 1.0
    settable: bool = True
    ignores: bool = False
    #: A draw the limit does not change (a GPU whose power the limit does not bound).
    fixed_draw_mw: int = 0
    #: Its set calls time out, and (as a hung driver call may) land anyway.
    late: bool = False
    limit_mw: int = 0
    power_read: bool = False

    def __post_init__(self) -> None:
        self.limit_mw = self.limit_mw or self.original_mw

    @property
    def uuid(self) -> str:
        return f"GPU-{self.index}"

    @property
    def clock_ratio(self) -> float:
        if self.limit_mw >= self.demand_mw:
            return 1.0
        return max(0.0, (self.limit_mw - self.static_mw) /
                   (self.demand_mw - self.static_mw)) ** (1 / 3)

    @property
    def throughput(self) -> float:
        r = self.clock_ratio
        return 1 / (self.compute / r + 1 - self.compute) if r > 0 else 0.0

    @property
    def draw_mw(self) -> int:
        if self.fixed_draw_mw:
            return self.fixed_draw_mw
        r = self.clock_ratio
        return round(self.static_mw + (self.demand_mw - self.static_mw) * r ** 3)


@dataclass
class Plant:
    gpus: list[PlantGpu]
    jobs: dict[str, EnergyAllowance] = field(default_factory=dict)
    base_rate: float = 100.0
    progress: float = 0.0
    collectives: bool = True
    t: float = 0.0
    sets: list[SetLimit] = field(default_factory=list)
    #: Every set: (time, the action, the tenant's floor in force (None: no declaration),
    #: the GPU's limit before it).
    log: list[tuple[float, SetLimit, float | None, int]] = field(default_factory=list)

    def pace(self) -> float:
        busy = [g.speed * g.throughput for g in self.gpus if g.job]
        return self.base_rate * min(busy, default=0.0)

    def advance(self, dt: float) -> None:
        self.progress += self.pace() * dt
        self.t += dt

    def observe(self) -> EnergyObservation:
        busy = [g for g in self.gpus if g.job]
        slowest = min(busy, key=lambda g: g.speed * g.throughput) if busy else None
        out = []
        for g in self.gpus:
            progress = None
            if self.collectives and g.job:
                behind = g is slowest or g.speed * g.throughput == slowest.speed * \
                    slowest.throughput
                progress = RankProgress(int(self.progress) + (0 if behind else 1), 1,
                                        None if len(busy) < 2 else not behind)
            power = PowerInfo(g.min_mw, g.max_mw, g.default_mw, g.original_mw) \
                if g.power_read else None
            out.append(EnergyGpu(g.index, g.uuid, g.job, g.limit_mw, g.draw_mw,
                                 round(1980 * g.clock_ratio), 100 if g.job else 0, power,
                                 progress))
        return EnergyObservation(tuple(out), dict(self.jobs))

    def apply(self, loop: EnergyLoop, actions: list[Action]) -> None:
        by_uuid = {g.uuid: g for g in self.gpus}
        for action in actions:
            g = by_uuid[action.uuid]
            if isinstance(action, ReadPower):
                g.power_read = True
                continue
            self.sets.append(action)
            allowance = self.jobs.get(g.job) if g.job else None
            self.log.append((self.t, action, allowance.min_watts if allowance else None,
                             g.limit_mw))
            if not g.settable:
                loop.failed(action, "Insufficient Permissions", self.t)
                continue
            if g.late:
                g.limit_mw = action.limit_mw
                loop.failed(action, "did not return in 2 s", self.t, uncertain=True)
                continue
            if not g.ignores:
                g.limit_mw = action.limit_mw
            loop.applied(action, self.t)

    def run(self, loop: EnergyLoop, seconds: float, dt: float = 1.0) -> None:
        end = self.t + seconds
        while self.t < end:
            self.apply(loop, loop.step(self.observe(), self.t))
            self.advance(dt)

    def limits(self) -> Mapping[int, int]:
        return {g.index: g.limit_mw // W for g in self.gpus}


class StatsFile:
    """One rank's stats file as the tuner plugin writes it (native/tuner/hz_shm.h): one
    communicator slot whose collective count the test moves, under its seqlock, with the
    shared lock a live process holds."""

    HOT = struct.Struct("<QIIQII")  # comm_id, n_ranks, n_nodes, collectives, in_use, seq
    COLD = struct.Struct("<IIQQQQQQIIQQQII")  # flags first; the rest 0

    def __init__(self, directory: Path, job: str, pid: int, comm: int, n_ranks: int,
                 tag: int = 0x5EED) -> None:
        self.path = directory / job / f"{pid}-{tag:016x}.stats"
        self.comm, self.n_ranks = comm, n_ranks
        image = bytearray(STATS_SIZE)
        STATS_HEADER.pack_into(image, 0, STATS_MAGIC, STATS_VERSION, STATS_SLOTS, pid, 22900,
                               tag)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o640)
        os.write(self.fd, bytes(image))
        fcntl.flock(self.fd, fcntl.LOCK_SH)  # alive, as the plugin's process is
        self.seq = 0
        self.set(0)

    def set(self, collectives: int) -> None:
        self.seq += 2
        slot = self.HOT.pack(self.comm, self.n_ranks, 1, collectives, 1, self.seq) + \
            self.COLD.pack(FLAG_MAPPED, *([0] * 14))
        os.pwrite(self.fd, slot, STATS_HEADER_SIZE)

    def close(self) -> None:
        os.close(self.fd)
