"""Which tenant job a GPU process belongs to, as the provider labelled it.

The job's identity comes from the provider, never from the tenant's code: an
environment variable the provider's scheduler sets (``HARMONAIZE_JOB`` by
default) or the process's cgroup path matched against a pattern (a Slurm job
or a Kubernetes pod). A rank name, in the tenant's own terms, comes from the
launcher's variables (``RANK``) where present. Everything read from /proc is
untrusted and validated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from agent.gpu.types import JobRef

_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,127}")
MAX_ENVIRON = 256 * 1024


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


def valid(name: str | None) -> str | None:
    return name if name and _IDENT.fullmatch(name) else None


class JobResolver:
    def __init__(
        self,
        proc_root: str | Path = "/proc",
        job_env: str = "HARMONAIZE_JOB",
        cgroup_pattern: str = "",
        rank_env: Sequence[str] = ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"),
    ) -> None:
        self.proc_root = Path(proc_root)
        self.job_env = job_env
        self.pattern = re.compile(cgroup_pattern) if cgroup_pattern else None
        self.rank_env = tuple(rank_env)
        self._cache: dict[int, JobRef | None] = {}

    def resolve(self, pid: int) -> JobRef | None:
        if pid in self._cache:
            return self._cache[pid]
        ref = self._read(pid)
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[pid] = ref
        return ref

    def forget_except(self, live: set[int]) -> None:
        """Drop cached pids that are gone (their numbers will be reused)."""
        for pid in [p for p in self._cache if p not in live]:
            del self._cache[pid]

    def _read(self, pid: int) -> JobRef | None:
        base = self.proc_root / str(pid)
        try:
            environ = (base / "environ").read_bytes()
        except OSError:
            environ = b""
        values = parse_environ(environ, (self.job_env, *self.rank_env))
        job = valid(values.get(self.job_env))
        if job is None:
            try:
                job = valid(job_from_cgroup((base / "cgroup").read_text(), self.pattern))
            except OSError:
                job = None
        if job is None:
            return None
        rank = next((valid(values[k]) for k in self.rank_env if valid(values.get(k))), None)
        return JobRef(job, rank)
