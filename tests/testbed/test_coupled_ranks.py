"""Coupled stand-in ranks (tests/bin/nccl_rank.py --sync, testbed/rendezvous.py): a rank
issues collective N through the real plugin, then waits until every rank of its
communicator has issued N, as NCCL ranks block; pauses every rank takes together, a
slow rank, hold and release, and SIGTERM while blocked. Counts are the plugin's own
stats, read as the agent reads them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.plugin.statsread import read_stats
from testbed.ranks import RankKit, RankProcess, issued, stop
from tests.daemons import wait_until

pytestmark = pytest.mark.jobhealth

JOB = "coupled"
COMM = 0x0C0C_0000_0000_0003
RANKS = 3


class Rig:
    """A rendezvous server on loopback, a rank kit, and the ranks' stats directory."""

    def __init__(self, server: subprocess.Popen[str], address: str, kit: RankKit,
                 directory: Path) -> None:
        self.server, self.address, self.kit, self.directory = server, address, kit, directory
        self.ranks: list[RankProcess] = []

    def start(self, rate: float = 100.0, comm: int = COMM, **kwargs: Any) -> list[RankProcess]:
        slow = kwargs.pop("slow", {})
        self.ranks = [self.kit.start(job=JOB, directory=self.directory, comm=comm,
                                     n_ranks=RANKS, n_nodes=1, rate=rate, sync=self.address,
                                     rank=r, slow=slow.get(r, 0.0), **kwargs)
                      for r in range(RANKS)]
        wait_until(lambda: len(self.counts()) == RANKS and min(self.counts()) > 5,
                   timeout=30, what="every rank counted and moving")
        return self.ranks

    def counts(self) -> list[int]:
        """Each running rank's collectives, in rank order (the plugin's stats), as they
        all stood at one instant: two reads in a row that agree (counts only grow, so
        every count held from its first read to its second, a moment they share)."""
        last = self._read()
        while (now := self._read()) != last:
            last = now
        return now

    def _read(self) -> list[int]:
        by_pid = {s.pid: s.collectives for s in read_stats(self.directory, JOB,
                                                           remove_dead=False)}
        return [by_pid[r.proc.pid] for r in self.ranks if r.proc.pid in by_pid]


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    directory = tmp_path / "tuner"
    (directory / JOB).mkdir(parents=True)
    server = subprocess.Popen([sys.executable, "-m", "testbed.rendezvous", "--listen",
                               "127.0.0.1:0"], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline().split()
        assert line[:1] == ["listening"], line
        with RankKit() as kit:
            rig = Rig(server, line[1], kit, directory)
            try:
                yield rig
            finally:
                for rank in rig.ranks:
                    if rank.proc.poll() is None:
                        rank.proc.send_signal(signal.SIGCONT)
                stop(rig.ranks)
    finally:
        server.terminate()
        server.wait(timeout=10)


def settled(counts: Callable[[], list[int]]) -> list[int]:
    """Counts once they stopped changing (over a few reads)."""
    seen: list[list[int]] = []

    def same() -> bool:
        seen.append(counts())
        return len(seen) >= 5 and all(s == seen[-1] for s in seen[-5:])

    wait_until(same, timeout=30, what="the counts to settle")
    return seen[-1]


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def stop_behind(rig: Rig, rank: int) -> list[int]:
    """SIGSTOP ``rank`` and return the settled counts. A stop that lands between its
    collective and telling the server leaves every rank at one count (its fellows wait
    for a word it never sent): then it is continued and stopped again, up to 3 times."""
    pid = rig.ranks[rank].proc.pid
    for _ in range(3):
        os.kill(pid, signal.SIGSTOP)
        counts = settled(rig.counts)
        if len(set(counts)) > 1:
            return counts
        os.kill(pid, signal.SIGCONT)
        wait_until(lambda c=counts: min(rig.counts()) > c[0], timeout=30, what="moving")
    raise AssertionError("every stop left the ranks at one count")


def test_a_stopped_rank_blocks_its_fellows_one_collective_past_it_without_spinning(
        rig: Rig) -> None:
    ranks = rig.start()
    counts = stop_behind(rig, 1)
    # The fellows issued the collective the stopped rank never did, and wait in it.
    assert counts[0] == counts[2] == counts[1] + 1
    before = [cpu_ticks(r.proc.pid) for r in (ranks[0], ranks[2])]
    time.sleep(1.0)
    assert [state(r.proc.pid) for r in (ranks[0], ranks[2])] == ["S", "S"]
    # Asleep in select: a rank spinning would burn most of the second (100 ticks).
    assert all(cpu_ticks(r.proc.pid) - b < 10 for r, b in zip((ranks[0], ranks[2]), before,
                                                                strict=True))
    assert rig.counts() == counts
    os.kill(ranks[1].proc.pid, signal.SIGCONT)
    wait_until(lambda: min(rig.counts()) > counts[0] + 10, timeout=30,
               what="every rank moving again")


def test_every_rank_pauses_together_at_the_index_given(rig: Rig) -> None:
    ranks = rig.start(pauses={100: 3.0})
    wait_until(lambda: rig.counts() == [101] * RANKS, timeout=30, what="every rank at 101")
    assert settled(rig.counts) == [101] * RANKS  # paused there, all at one count
    assert [state(r.proc.pid) for r in ranks] == ["S"] * RANKS
    wait_until(lambda: min(rig.counts()) > 110, timeout=30, what="the ranks after the pause")


def test_a_slow_rank_sets_the_pace_its_fellows_never_more_than_one_ahead(rig: Rig) -> None:
    rig.start(rate=200.0, slow={2: 0.05})
    samples = []
    while len(samples) < 100:
        samples.append(rig.counts())
        time.sleep(0.01)
    assert all(max(c) - min(c) <= 1 for c in samples), samples
    behind = [c for c in samples if max(c) > min(c)]
    assert behind, "never caught the slow rank behind"
    # Mostly the slow one is behind (a fast one is, for the moment between its
    # release and its next collective).
    assert sum(c[2] < c[0] for c in behind) > len(behind) / 2


def test_uncoupled_a_slow_rank_falls_behind(tmp_path: Path) -> None:
    """Without --sync nothing waits: the slow rank's count falls ever further behind."""
    directory = tmp_path / "tuner"
    (directory / JOB).mkdir(parents=True)
    with RankKit() as kit:
        ranks = [kit.start(job=JOB, directory=directory, comm=COMM, n_ranks=2, n_nodes=1,
                           rate=200.0, slow=slow) for slow in (0.0, 0.05)]
        try:
            def gap() -> int:
                by_pid = {s.pid: s.collectives for s in read_stats(directory, JOB,
                                                                   remove_dead=False)}
                return by_pid.get(ranks[0].proc.pid, 0) - by_pid.get(ranks[1].proc.pid, 0)

            wait_until(lambda: gap() > 50, timeout=30, what="the slow rank far behind")
        finally:
            stop(ranks)


def test_a_held_rank_runs_issuing_nothing_until_released(rig: Rig) -> None:
    ranks = rig.start()
    os.kill(ranks[0].proc.pid, signal.SIGUSR1)
    counts = settled(rig.counts)
    assert counts[1] == counts[2] == counts[0] + 1
    assert state(ranks[0].proc.pid) == "S"  # its process is there, not stopped
    os.kill(ranks[0].proc.pid, signal.SIGUSR2)
    wait_until(lambda: min(rig.counts()) > counts[1] + 10, timeout=30,
               what="every rank moving after the release")


def test_sigterm_ends_ranks_blocked_on_a_stopped_fellow(rig: Rig) -> None:
    ranks = rig.start()
    counts = stop_behind(rig, 1)
    waiting = [ranks[0], ranks[2]]
    assert stop(waiting) == [True, True]  # each ended by itself, none had to be killed
    assert [r.proc.returncode for r in waiting] == [0, 0]
    assert [issued(r.log) for r in waiting] == [counts[0], counts[2]]
    os.kill(ranks[1].proc.pid, signal.SIGCONT)


def test_sigterm_ends_a_paused_and_a_held_rank(rig: Rig) -> None:
    ranks = rig.start(pauses={40: 600.0})
    wait_until(lambda: rig.counts() == [41] * RANKS, timeout=30, what="the long pause")
    os.kill(ranks[2].proc.pid, signal.SIGUSR1)
    assert stop(ranks) == [True] * RANKS
    assert [issued(r.log) for r in ranks] == [41] * RANKS


def run_rank(kit: RankKit, tmp_path: Path, *args: str,
             n_ranks: int = 2) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-I", str(kit.dir / "tests" / "bin" / "nccl_rank.py"),
            str(kit.library), hex(COMM), str(n_ranks), "1", "100", str(tmp_path / "log"),
            *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          env={"PATH": "/usr/bin:/bin", "HARMONAIZE_JOB": JOB,
                               "HARMONAIZE_TUNER_DIR": str(tmp_path)})


@pytest.mark.parametrize(("args", "says"), [
    (("--pauses", "ten:1"), "not INDEX:SECONDS"),
    (("--pauses", "10:-1"), "not INDEX:SECONDS"),
    (("--slow", "soon"), "not seconds"),
    (("--sync", "127.0.0.1"), "not HOST:PORT"),
    (("--sync", "127.0.0.1:7"), "--sync needs --rank"),
    (("--sync", "127.0.0.1:7", "--rank", "2"), "--sync needs --rank"),
])
def test_bad_options_are_one_line_not_a_traceback(tmp_path: Path, args: tuple[str, ...],
                                                  says: str) -> None:
    with RankKit() as kit:
        done = run_rank(kit, tmp_path, *args)
    assert done.returncode == 2 and says in done.stderr
    assert "Traceback" not in done.stderr


def test_a_rank_the_server_refuses_says_why_in_one_line(rig: Rig, tmp_path: Path) -> None:
    """A second rank 0 of the same communicator: the server refuses it."""
    rig.start()
    done = run_rank(rig.kit, tmp_path, "--sync", rig.address, "--rank", "0", n_ranks=RANKS)
    assert done.returncode == 3 and "already" in done.stderr and "Traceback" not in done.stderr


def test_no_server_is_one_line(tmp_path: Path) -> None:
    with RankKit() as kit:
        # Nothing listens on the discard port of loopback (tried for a few seconds).
        done = run_rank(kit, tmp_path, "--sync", "127.0.0.1:9", "--rank", "0")
    assert done.returncode == 2 and "cannot reach the rendezvous" in done.stderr
    assert "Traceback" not in done.stderr
