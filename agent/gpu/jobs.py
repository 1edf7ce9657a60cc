"""Which tenant job a GPU process belongs to, as the provider labelled it.

The job's identity comes from the kernel, never from the tenant's code alone:

1. the process's cgroup path matched against ``job_cgroup_pattern`` (a Slurm job's
   ``/job_<id>/``, a Kubernetes pod): cgroups are the scheduler's, a tenant cannot
   move its process into another job's;
2. else the environment variable the provider's scheduler sets (``HARMONAIZE_JOB`` by
   default), but only as a hint the process's credentials back: it holds the job's Unix
   group from the provider's placement (sent to the host with the job's declaration),
   or it is root's (the host's own, not a tenant's).

A process whose environment names a job its cgroup or credentials do not back is not
counted for that job (with a cgroup job, for that one only), logged once and counted
(:attr:`JobResolver.refused`): a tenant's rank that sets ``HARMONAIZE_JOB`` to
another tenant's job gets none of that job's advisories. A rank name, in the tenant's
own terms, comes from the launcher's variables (``RANK``) where present. Everything
read from /proc is untrusted and validated.
"""

from __future__ import annotations

import grp
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agent.gpu.types import JobRef

log = logging.getLogger("harmonaize.agent")

_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
MAX_ENVIRON = 256 * 1024
#: /proc/PID/status and /proc/PID/cgroup are the kernel's; still, read no more than this.
MAX_PROC_TEXT = 64 * 1024
#: Cached processes (and group names), at most: the cache is cleared past it.
MAX_CACHED = 4096


@dataclass(frozen=True)
class ProcessFacts:
    """What /proc says of a process: its claims (environment) and the kernel's word."""

    env_job: str | None = None
    rank: str | None = None
    cgroup_job: str | None = None
    #: Real user id (None: unreadable).
    uid: int | None = None
    #: Real, effective, saved and filesystem group ids, and the supplementary groups.
    gids: frozenset[int] = frozenset()


def parse_environ(data: bytes, keys: Sequence[str]) -> dict[str, str]:
    """The values of ``keys`` in a NUL-separated environment block."""
    wanted = {k.encode() + b"=": k for k in keys}
    found: dict[str, str] = {}
    for entry in data[:MAX_ENVIRON].split(b"\0"):
        for prefix, key in wanted.items():
            if entry.startswith(prefix):
                found[key] = entry[len(prefix):].decode("utf-8", "replace")
    return found


def job_from_cgroup(text: str, pattern: re.Pattern[str] | None) -> str | None:
    if pattern is None:
        return None
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = pattern.search(path)
        if match and "job" in match.groupdict() and match["job"]:
            return match["job"]
    return None


def credentials(status: str) -> tuple[int | None, frozenset[int]]:
    """The real uid and every group id from /proc/PID/status (None, empty: unreadable)."""
    uid: int | None = None
    gids: set[int] = set()
    for line in status.splitlines():
        key, _, value = line.partition(":")
        try:
            if key == "Uid":
                uid = int(value.split()[0])
            elif key in ("Gid", "Groups"):
                gids.update(int(v) for v in value.split())
        except (ValueError, IndexError):
            return None, frozenset()
    return uid, frozenset(gids)


def valid(name: str | None) -> str | None:
    return name if name and _IDENT.fullmatch(name) else None


def no_group(job: str) -> str | None:
    return None


class JobResolver:
    def __init__(
        self,
        proc_root: str | Path = "/proc",
        job_env: str = "HARMONAIZE_JOB",
        cgroup_pattern: str = "",
        rank_env: Sequence[str] = ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"),
        group_of: Callable[[str], str | None] = no_group,
    ) -> None:
        self.proc_root = Path(proc_root)
        self.job_env = job_env
        self.pattern = re.compile(cgroup_pattern) if cgroup_pattern else None
        self.rank_env = tuple(rank_env)
        #: The Unix group of a job's processes on this host, from its placement (the
        #: agent's declarations); None: not known here.
        self.group_of = group_of
        #: Processes whose environment named a job the kernel does not back.
        self.refused = 0
        self._refused: set[int] = set()
        self._cache: dict[int, ProcessFacts] = {}
        self._gids: dict[str, int] = {}

    def resolve(self, pid: int) -> JobRef | None:
        facts = self._cache.get(pid)
        if facts is None:
            facts = self._read(pid)
            # A root process is not cached: a launcher starts a rank as root and drops to
            # the tenant's uid (setpriv, su) moments later, and what it was at the first
            # look must not stand for what it is now. Root's processes on a GPU are few.
            if facts.uid not in (0, None):
                if len(self._cache) > MAX_CACHED:
                    self._cache.clear()
                self._cache[pid] = facts
        # Judged at every look (cheap): a job's group may arrive after its processes.
        job = self._judge(pid, facts)
        return JobRef(job, facts.rank) if job is not None else None

    def forget_except(self, live: set[int]) -> None:
        """Drop cached pids that are gone (their numbers will be reused)."""
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]
        self._refused &= live

    def _judge(self, pid: int, facts: ProcessFacts) -> str | None:
        claim = facts.env_job
        if facts.cgroup_job is not None:
            if claim is not None and claim != facts.cgroup_job:
                self._refuse(pid, claim, f"its cgroup is job {facts.cgroup_job}'s")
            return facts.cgroup_job
        if claim is None:
            return None
        if facts.uid == 0:
            return claim  # root's process: the host's own, not a tenant's
        group = self.group_of(claim)
        gid = self._gid(group) if group else None
        if gid is not None and gid in facts.gids:
            return claim
        self._refuse(pid, claim, f"it is not in the job's group ({group})" if group
                     else "the job's group on this host is not known")
        return None

    def _refuse(self, pid: int, claim: str, why: str) -> None:
        if pid in self._refused:
            return
        self._refused.add(pid)
        self.refused += 1
        log.warning("process %d names job %r in %s, but %s: not counted for that job",
                    pid, claim, self.job_env, why)

    def _gid(self, group: str) -> int | None:
        if group.isdigit():
            return int(group)
        if group in self._gids:
            return self._gids[group]
        if len(self._gids) > MAX_CACHED:
            self._gids.clear()
        try:
            self._gids[group] = grp.getgrnam(group).gr_gid
        except KeyError:
            # Not cached: a job's group may be made on the host after its placement
            # arrives (a prolog, a directory service catching up), and must count then.
            # The names come from the provider's placements, so the lookups are few.
            return None
        return self._gids[group]

    def _read(self, pid: int) -> ProcessFacts:
        base = self.proc_root / str(pid)
        environ = _read(base / "environ", MAX_ENVIRON)
        values = parse_environ(environ, (self.job_env, *self.rank_env))
        cgroup_job = None
        if self.pattern is not None:
            text = _read(base / "cgroup", MAX_PROC_TEXT).decode("utf-8", "replace")
            cgroup_job = valid(job_from_cgroup(text, self.pattern))
        uid, gids = credentials(_read(base / "status", MAX_PROC_TEXT).decode("utf-8",
                                                                             "replace"))
        rank = next((valid(values[k]) for k in self.rank_env if valid(values.get(k))), None)
        return ProcessFacts(valid(values.get(self.job_env)), rank, cgroup_job, uid, gids)


def _read(path: Path, limit: int) -> bytes:
    try:
        with path.open("rb") as f:
            return f.read(limit)
    except OSError:
        return b""
