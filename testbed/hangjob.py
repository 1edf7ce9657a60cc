"""A job of the hang lab (testbed/hanglab.py): eight coupled ranks of one communicator
on two hosts, and the faults made to one of them."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from testbed.cluster import wait_until
from testbed.ranks import RankProcess, stop

if TYPE_CHECKING:
    from testbed.hanglab import HangLab

HOSTS = ("h0", "h1")
RANKS_PER_HOST = 4
N_RANKS = RANKS_PER_HOST * len(HOSTS)
GROUP = 61300  # the jobs' Unix group; rank r runs as uid GROUP + 1 + r
#: Collectives a second each rank issues (the coupling permitting).
RATE = 20.0


class LabJob:
    """One placed job and its running communicator (eight coupled ranks)."""

    def __init__(self, lab: HangLab, name: str) -> None:
        self.lab = lab
        self.name = name
        self.comm = 0
        self.ranks: list[RankProcess] = []

    @staticmethod
    def host_of(rank: int) -> str:
        return HOSTS[rank // RANKS_PER_HOST]

    @staticmethod
    def gpu_of(rank: int) -> int:
        return rank % RANKS_PER_HOST

    def pid(self, rank: int) -> int:
        return self.ranks[rank].proc.pid

    # --- ranks ------------------------------------------------------------------------

    def start(self, *, pauses: Mapping[int, float] | None = None,
              slow: Mapping[int, float] | None = None, rate: float = RATE) -> int:
        """Stop the ranks running, start eight coupled ones of a new communicator (its
        id is returned); ``pauses`` for every rank, ``slow`` seconds per rank."""
        self.stop()
        self.comm = self.lab.next_comm()
        kit, cluster = self.lab.kit, self.lab.cluster
        assert kit is not None
        with self.lab.lock:  # jobs may start from several threads (the kit counts logs)
            for rank in range(N_RANKS):
                host = self.host_of(rank)
                self.ranks.append(kit.start(
                    job=self.name, directory=cluster.policy_dir(host), comm=self.comm,
                    n_ranks=N_RANKS, n_nodes=len(HOSTS), rate=rate, uid=GROUP + 1 + rank,
                    gid=GROUP, lab=self.lab.lab, host=host, sync=self.lab.rendezvous,
                    rank=rank, pauses=pauses, slow=(slow or {}).get(rank, 0.0)))
                self.lab.on_gpu(host, self.gpu_of(rank), self.ranks[-1].proc.pid)
        return self.comm

    def stop(self) -> list[bool]:
        """SIGTERM every rank (continued and released first); whether each ended itself."""
        for rank in self.ranks:
            if rank.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    rank.proc.send_signal(signal.SIGCONT)
                    rank.proc.send_signal(signal.SIGUSR2)
        ended = stop(self.ranks)
        for index, rank in enumerate(self.ranks):
            self.lab.on_gpu(self.host_of(index), self.gpu_of(index), rank.proc.pid, gone=True)
        self.ranks = []
        return ended

    def view(self, host: str) -> dict[str, Any] | None:
        """``host``'s agent's job-health view of the running communicator (None: not seen)."""
        jobs = self.lab.cluster.agent_request(host, "job-health", {"job": self.name})["jobs"]
        comms = [c for j in jobs for c in j["comms"] if int(c["comm"], 16) == self.comm]
        return comms[0] if comms else None

    def running(self, timeout: float = 30.0, collectives: int = 20) -> None:
        """Wait until both agents count their four ranks of it and see them issue
        ``collectives`` more."""
        def counted() -> dict[str, int] | None:
            views = {h: self.view(h) for h in HOSTS}
            if not all(v and v["ranks_here"] == RANKS_PER_HOST for v in views.values()):
                return None
            return {h: v["collectives_min"] for h, v in views.items() if v}

        first = wait_until(counted, timeout, f"both agents to count job {self.name}'s ranks",
                           interval=0.1)
        wait_until(lambda: (now := counted()) and all(now[h] >= first[h] + collectives
                                                      for h in HOSTS),
                   timeout, f"job {self.name}'s ranks to move", interval=0.1)

    # --- faults -----------------------------------------------------------------------

    def signal(self, rank: int, sig: signal.Signals) -> None:
        os.kill(self.pid(rank), sig)

    def hold(self, rank: int) -> None:
        """The rank stops issuing collectives, its process running (SIGUSR1)."""
        self.signal(rank, signal.SIGUSR1)

    def release(self, rank: int) -> None:
        self.signal(rank, signal.SIGUSR2)

    def gpu_fault(self, rank: int, xid: int = 48) -> None:
        """An XID on the rank's GPU in the fake NVML (48, a double-bit ECC error: the
        hardware's, whoever runs there)."""
        self.lab.cluster.gpus[self.host_of(rank)].inject_xid(self.gpu_of(rank), xid)
