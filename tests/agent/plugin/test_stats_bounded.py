"""Issue 28, item 2: the work a tenant's stats files cost the agent is bounded per pass.

One rank made 100 stats files with a valid header and a slot left mid-update (its seqlock
odd); the agent retried each with sleeps, fell from ~10 passes a second to 0.8, and the
host was counted down. Here real stats files (the plugin's layout, each held under the
shared lock a live process holds) are read by the real reader and service; the tests
count the reads the agent makes (``os.pread`` calls), never the time they take.
"""

from __future__ import annotations

import fcntl
import math
import os
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.links.settings import LinksSection
from agent.plugin.layout import (
    FLAG_MAPPED,
    STATS_HEADER,
    STATS_HEADER_SIZE,
    STATS_MAGIC,
    STATS_SIZE,
    STATS_SLOT_SIZE,
    STATS_SLOTS,
    STATS_VERSION,
)
from agent.plugin.shm import StatsLimits, StatsReader, prepare_dirs, prepare_job_dir
from agent.tuning.service import TuningService
from agent.tuning.settings import TuningSection
from harmonaize.messages import Algorithm, Collective, JobDeclaration, Protocol, TuningRange
from testbed.tuningsim import link_judgements, link_sample
from tests.conftest import needs_root

pytestmark = [pytest.mark.hardening, needs_root]

JOB = "train-stalled"
RANK, OTHER = 61011, 61012
HOT = struct.Struct("<QIIQII")  # comm_id, n_ranks, n_nodes, collectives, in_use, seq
COLD = struct.Struct("<IIQQQQQQIIQQQII")  # flags first; the rest 0


class Stats:
    """One process's stats file as the plugin writes it, locked as a live process holds
    it; slot 0 carries a communicator, its seqlock even (settled) or odd (mid-update)."""

    def __init__(self, folder: Path, pid: int, *, uid: int, comm: int = 0xC0FFEE,
                 collectives: int = 1, odd: bool = False) -> None:
        self.pid, self.comm = pid, comm
        self.name = f"{pid}-{pid:016x}.stats"
        image = bytearray(STATS_SIZE)
        STATS_HEADER.pack_into(image, 0, STATS_MAGIC, STATS_VERSION, STATS_SLOTS, pid, 22900,
                               pid)
        self.fd = os.open(folder / self.name, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o640)
        os.write(self.fd, bytes(image))
        os.fchown(self.fd, uid, uid)
        fcntl.flock(self.fd, fcntl.LOCK_SH)
        self.seq = 0
        self.set(collectives, odd=odd)

    def set(self, collectives: int, *, odd: bool = False) -> None:
        self.seq += 1 if odd else 2 - self.seq % 2
        slot = HOT.pack(self.comm, 2, 1, collectives, 1, self.seq) + \
            COLD.pack(FLAG_MAPPED, *([0] * 14))
        assert len(slot) == STATS_SLOT_SIZE
        os.pwrite(self.fd, slot, STATS_HEADER_SIZE)

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def folder(workdir: Path) -> Path:
    directory = workdir / "tuner"
    prepare_dirs(directory)
    return prepare_job_dir(directory, JOB, RANK)


@pytest.fixture
def files() -> Iterator[list[Stats]]:
    made: list[Stats] = []
    yield made
    for stats in made:
        stats.close()


@pytest.fixture
def preads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every os.pread the agent makes, by descriptor: its reads of tenants' files."""
    made: list[int] = []
    real = os.pread

    def counted(fd: int, n: int, offset: int) -> bytes:
        made.append(fd)
        return real(fd, n, offset)

    monkeypatch.setattr(os, "pread", counted)
    return made


def test_item2_a_hundred_stats_files_stuck_mid_update_cost_a_bounded_number_of_reads(
        folder: Path, files: list[Stats], preads: list[int]) -> None:
    limits = StatsLimits()
    reader = StatsReader(folder.parent, limits)
    real = Stats(folder, 1000, uid=RANK, comm=0xAB, collectives=7)
    files.append(real)
    assert [s.collectives for s in reader.read(JOB)] == [7]  # admitted first
    files.extend(Stats(folder, 2000 + k, uid=RANK, odd=True) for k in range(100))

    bound = 2 * limits.seqlock_tries * limits.per_read  # two reads a try, per file read
    turns = math.ceil(limits.per_uid / limits.per_read)
    for turn in range(1, 2 * turns + 1):
        real.set(7 + turn)
        preads.clear()
        slots = reader.read(JOB)
        assert 0 < len(preads) <= bound
        # The rank's real file is still read (or its reading of the last turn stands).
        assert [(s.comm_id, s.pid) for s in slots] == [(0xAB, 1000)]
        assert slots[0].collectives >= 7 + turn - turns
        assert slots.excess == 101 - limits.per_uid  # over the per-uid cap: counted, ignored
        assert slots.reads <= limits.seqlock_tries * limits.per_read
    # Every admitted file had its turn: each stuck slot was found stale once per turn.
    assert reader.totals["stale"] == (limits.per_uid - 1) * 2
    assert reader.totals["excess"] == (101 - limits.per_uid) * 2 * turns


def test_item2_files_over_the_caps_are_counted_for_operators_and_ignored(
        folder: Path, files: list[Stats]) -> None:
    """Per uid first, then per job; ``harmonctl jobs`` shows how many were ignored."""
    cfg = TuningSection(policy_dir=str(folder.parent), htb=False, stats_files_per_uid=3,
                        stats_files_per_job=5)
    service = TuningService(cfg, LinksSection(), publish=lambda message: None)
    service.start(0.0)
    service.declare(JobDeclaration(JOB, revision=1, group=str(RANK), tuning=(TuningRange(
        (Collective.ALLREDUCE,), (Algorithm.RING,), (Protocol.SIMPLE,), 0, 1 << 40, 2, 16),)),
        0.0)
    files.extend(Stats(folder, 3000 + k, uid=RANK, comm=0x100 + k) for k in range(4))
    files.extend(Stats(folder, 4000 + k, uid=OTHER, comm=0x200 + k) for k in range(4))
    service.step(link_sample(0), link_judgements(0), 1.0)
    read = service.stats[JOB]
    assert sorted(s.comm_id for s in read) == [0x100, 0x101, 0x102, 0x200, 0x201]
    assert read.excess == 3
    view = service.jobs_view(1.0)["stats_files"]
    assert view["ignored"] >= 3 and view["stale_slots"] == 0
    assert service.policy_view({"job": JOB}, 1.0)["ignored_stats_files"] == 3


def test_item2_files_not_reached_this_pass_are_read_in_turn_so_none_starves(
        folder: Path, files: list[Stats]) -> None:
    reader = StatsReader(folder.parent, StatsLimits(per_read=3))
    files.extend(Stats(folder, 5000 + k, uid=RANK, comm=0x300 + k, collectives=1)
                 for k in range(8))
    first = reader.read(JOB)
    assert first.deferred == 5 and len(first) == 3  # nothing read before: nothing stands in
    for _ in range(2):
        reader.read(JOB)
    for stats in files:
        stats.set(2)
    counts = []
    for _ in range(3):
        slots = reader.read(JOB)
        assert len(slots) == 8  # every file's slot, read now or its last reading
        counts.append(sum(s.collectives == 2 for s in slots))
    assert counts == [3, 6, 8]


def test_item2_a_slot_that_stays_odd_is_stale_and_its_last_reading_stands(
        folder: Path, files: list[Stats], preads: list[int]) -> None:
    tries = 3
    reader = StatsReader(folder.parent, StatsLimits(seqlock_tries=tries))
    stats = Stats(folder, 6000, uid=RANK, collectives=5)
    files.append(stats)
    assert [s.collectives for s in reader.read(JOB)] == [5]
    stats.set(6, odd=True)  # the writer stops mid-update
    preads.clear()
    slots = reader.read(JOB)
    assert [s.collectives for s in slots] == [5] and slots.stale == 1
    # Tried ``tries`` times (each a read, and a second one only where slots were settled).
    assert tries <= len(preads) <= 2 * tries
    stats.set(7)
    assert [s.collectives for s in reader.read(JOB)] == [7]


def test_item2_junk_names_beyond_the_listing_cap_cannot_push_out_an_admitted_file(
        folder: Path, files: list[Stats]) -> None:
    """A listing stops at 4 * per_job names; a rank's file admitted before stays read."""
    reader = StatsReader(folder.parent, StatsLimits(per_job=4))
    real = Stats(folder, 7000, uid=RANK, collectives=1)
    files.append(real)
    assert [s.collectives for s in reader.read(JOB)] == [1]
    for k in range(500):
        (folder / f"junk-{k}").write_bytes(b"")
    real.set(2)
    slots = reader.read(JOB)
    assert [s.collectives for s in slots] == [2]
    assert slots.excess > 0  # the names it did not list are counted
