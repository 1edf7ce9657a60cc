"""Stand-in NCCL ranks as separate processes, of any Unix user.

A tenant's ranks are rarely root. :class:`RankKit` copies what a stand-in
rank needs (``tests/bin/nccl_rank.py``, the plugin's Python binding, the
plugin and the stand-in NCCL) into a directory every user can read, so a
rank can run as any uid and group with the system Python, wherever the
project itself lives. :meth:`RankKit.start` launches one (optionally in a
lab's namespace, through ``setpriv``), coupled to its fellows through a rendezvous
server (testbed/rendezvous.py) if asked; :func:`outcomes` reads its log of answers and
:func:`disagreement` compares ranks collective by collective.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.netns import Lab

ROOT = Path(__file__).resolve().parent.parent
FILES = ("tests/bin/nccl_rank.py", "harmonaize/__init__.py", "testbed/__init__.py",
         "testbed/plugin.py", "testbed/rendezvous.py",
         "native/build/libnccl-tuner-harmonaize.so",
         "native/build/libnccl-fake.so")

Outcome = tuple[int, str, str, int]  # from index, algorithm, protocol, channels


@dataclass
class RankProcess:
    proc: subprocess.Popen[Any]
    log: Path
    host: str

    def outcomes(self) -> list[Outcome]:
        return outcomes(self.log)


class RankKit:
    """A world-readable copy of a stand-in rank; remove it with :meth:`close`."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="hz-ranks-"))
        for name in FILES:
            target = self.dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, target)
        for path in [self.dir, *self.dir.rglob("*")]:
            path.chmod(0o755)
        self.logs = self.dir / "logs"
        self.logs.mkdir(mode=0o1777)
        self.logs.chmod(0o1777)  # each rank, of whatever user, writes its own log here
        self._count = 0

    @property
    def library(self) -> Path:
        return self.dir / "native" / "build" / "libnccl-tuner-harmonaize.so"

    def start(self, *, job: str, directory: Path, comm: int, n_ranks: int, n_nodes: int,
              rate: float, uid: int | None = None, gid: int | None = None,
              groups: Sequence[int] = (), lab: Lab | None = None, host: str = "",
              nccl: int | None = 23203, abi: int = 5, limit: int = 0,
              env: Mapping[str, str] | None = None, sync: str = "", rank: int | None = None,
              pauses: Mapping[int, float] | None = None, slow: float = 0.0) -> RankProcess:
        """``sync`` (a rendezvous server's HOST:PORT) couples the rank, rank ``rank`` of
        ``n_ranks``, to its fellows; ``rank`` is also its ``RANK``, as a launcher sets it.
        ``pauses``: after which collectives it pauses, and for how long (every rank of a
        job gets the same); ``slow``: seconds it adds before each collective."""
        self._count += 1
        log = self.logs / f"rank-{self._count}-{host or 'local'}.log"
        argv = [sys.executable if uid is None else "/usr/bin/python3", "-I",
                str(self.dir / "tests" / "bin" / "nccl_rank.py"), str(self.library), hex(comm),
                str(n_ranks), str(n_nodes), str(rate), str(log), "--abi", str(abi)]
        if nccl is not None:
            argv += ["--nccl", str(nccl)]
        if limit:
            argv += ["--limit", str(limit)]
        if sync:
            argv += ["--sync", sync, "--rank", str(rank)]
        if pauses:
            argv += ["--pauses", ",".join(f"{i}:{s:g}" for i, s in sorted(pauses.items()))]
        if slow:
            argv += ["--slow", f"{slow:g}"]
        if uid is not None:
            # A tenant's process: its own uid and groups, nothing inherited from root.
            ids = ["--reuid", str(uid), "--regid", str(gid if gid is not None else uid)]
            ids += ["--groups", ",".join(map(str, groups))] if groups else ["--clear-groups"]
            argv = ["setpriv", *ids, *argv]
        if lab is not None:
            argv = lab.cmd(host, argv)
        environment = {"PATH": "/usr/bin:/bin", "HARMONAIZE_JOB": job,
                       "HARMONAIZE_TUNER_DIR": str(directory),
                       **({"RANK": str(rank)} if rank is not None else {}), **(env or {})}
        proc = subprocess.Popen(argv, env=environment, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        return RankProcess(proc, log, host)

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RankKit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def stop(ranks: Sequence[RankProcess], timeout: float = 5.0) -> list[bool]:
    """SIGTERM every rank; one still waiting in the plugin after ``timeout`` is killed.
    Returns, per rank, whether it ended by itself (False: it was stuck)."""
    for rank in ranks:
        if rank.proc.poll() is None:
            rank.proc.terminate()
    ended = []
    for rank in ranks:
        try:
            rank.proc.wait(timeout=timeout)
            ended.append(True)
        except subprocess.TimeoutExpired:
            rank.proc.kill()
            rank.proc.wait()
            ended.append(False)
    return ended


def outcomes(log: Path) -> list[Outcome]:
    rows = []
    for line in log.read_text().splitlines() if log.exists() else []:
        parts = line.split()
        if len(parts) == 4:
            rows.append((int(parts[0]), parts[1], parts[2], int(parts[3])))
    return rows


def issued(log: Path) -> int | None:
    """How many collectives a rank that stopped by itself issued (None: it did not say)."""
    for line in reversed(log.read_text().splitlines() if log.exists() else []):
        parts = line.split()
        if len(parts) == 2 and parts[0] == "end":
            return int(parts[1])
    return None


def disagreement(logs: Sequence[list[Outcome]], issued: Sequence[int]) -> str:
    """The first collective both of two ranks issued at which they answered differently.

    ``issued[i]`` bounds how far rank ``i`` is known to have gone (its collective
    count); a log only records changes, so between them the answer holds.
    """
    def answer_at(rows: list[Outcome], index: int) -> tuple[str, str, int] | None:
        found = None
        for start, algo, proto, channels in rows:
            if start > index:
                break
            found = (algo, proto, channels)
        return found

    for i, a in enumerate(logs):
        for j in range(i + 1, len(logs)):
            b = logs[j]
            limit = min(issued[i], issued[j])
            points = sorted({0, *(r[0] for r in a), *(r[0] for r in b)})
            for index in points:
                if index >= limit:
                    break
                x, y = answer_at(a, index), answer_at(b, index)
                if x != y:
                    return f"collective {index}: a rank ran {x}, another {y}"
    return ""
