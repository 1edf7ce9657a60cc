"""The Slurm hook as a test runs it: its configuration, its directories, a wrapper
slurmctld can run, and the hook run by hand as a real process."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

HOOK = [sys.executable, "-m", "harmonaize.slurm.hook"]
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Hook:
    config: Path
    spool: Path
    log: Path
    wrapper: Path

    def run(self, kind: str | None, env: Mapping[str, str], *,
            user: str | None = None) -> subprocess.CompletedProcess[str]:
        """The hook as slurmctld runs it: only ``env`` (slurmctld passes no PATH), as
        ``user`` where given."""
        argv = [*HOOK, "--config", str(self.config), *([kind] if kind else [])]
        extra = {}
        if user is not None:
            entry = pwd.getpwnam(user)
            extra = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
        return subprocess.run(argv, env={"PYTHONPATH": str(ROOT), **env}, capture_output=True,
                              text=True, timeout=60, check=False, cwd="/", **extra)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def queued(self) -> list[Path]:
        queue = self.spool / "queue"
        return sorted(queue.glob("*.json")) if queue.exists() else []

    def rejected(self) -> list[Path]:
        kept = self.spool / "rejected"
        return sorted(kept.glob("*.json")) if kept.exists() else []


def make_hook(workdir: Path, socket: Path, *, accounts: Mapping[str, str] | None = None,
              users: Mapping[str, str] | None = None, hosts: Mapping[str, str] | None = None,
              owner: str = "root", extra: str = "") -> Hook:
    """A hook configuration in ``workdir/hook``, its spool and log writable by ``owner``
    (Slurm's SlurmUser when slurmctld runs it)."""
    base = workdir / "hook"
    base.mkdir(mode=0o755)
    spool, logs = base / "spool", base / "log"
    entry = pwd.getpwnam(owner)
    for path in (spool, logs):
        path.mkdir(mode=0o750)
        os.chown(path, entry.pw_uid, entry.pw_gid)

    def table(name: str, values: Mapping[str, str] | None) -> str:
        rows = "".join(f'"{k}" = "{v}"\n' for k, v in (values or {}).items())
        return f"[{name}]\n{rows}"

    config = base / "slurm.toml"
    config.write_text(
        f'socket = "{socket}"\nspool = "{spool}"\nlog = "{logs / "slurm.log"}"\n' + extra
        + table("accounts", accounts) + table("users", users) + table("hosts", hosts))
    wrapper = base / "harmonaize-slurm"
    # What an operator would name in slurm.conf is the console script itself; the
    # wrapper only adds this test's configuration file and checkout.
    wrapper.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m "
                       f"harmonaize.slurm.hook --config {config} \"$@\"\n")
    wrapper.chmod(0o755)
    return Hook(config, spool, logs / "slurm.log", wrapper)


def job_env(job: str = "7", *, account: str = "physics", user: str = "alice",
            nodes: str = "gpu-[01-02]", gid: str = "4242", context: str = "prolog_slurmctld",
            **more: str) -> dict[str, str]:
    """What slurmctld puts in a PrologSlurmctld's environment (as Slurm 22.05 does)."""
    return {"SLURM_JOB_ID": job, "SLURM_JOBID": job, "SLURM_JOB_ACCOUNT": account,
            "SLURM_JOB_USER": user, "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": gid,
            "SLURM_JOB_NODELIST": nodes, "SLURM_JOB_PARTITION": "gpu",
            "SLURM_SCRIPT_CONTEXT": context, "SLURM_CLUSTER_NAME": "hz", **more}
