"""Which cgroup layout the Slurm testbed runs its jobs in, and where Slurm puts them.

Slurm's ``proctrack/cgroup`` tracks a job's processes in cgroups; Slurm 22.05 has a
plugin for each layout:

``v1``
    A cgroup v1 ``freezer`` hierarchy at ``/sys/fs/cgroup/freezer`` (legacy or hybrid
    hosts). Slurm makes ``/sys/fs/cgroup/<controller>/slurm_<node>/uid_<u>/job_<j>/...``.
``v2``
    cgroup2 at ``/sys/fs/cgroup`` (a fresh Debian 12 with systemd mounts nothing else).
    With no systemd managing slurmstepd's scope (``IgnoreSystemd=yes``; with
    ``CgroupAutomount=yes`` Slurm enables the controllers it needs itself), slurmd makes
    ``<mount>/system.slice/<node>_slurmstepd.scope`` (the node name is in it because
    Debian builds Slurm for multiple slurmd per host: several node names never share a
    tree) and moves itself into its ``slurmd`` child; a task runs in
    ``.../job_<j>/step_<n>/user/task_<t>`` (``task_special`` under ``task/none``).
    Slurm only ``mkdir``s the scope, so the testbed makes ``system.slice`` where no
    systemd did.

A hybrid host (v1 controllers plus an empty cgroup2 at ``/sys/fs/cgroup/unified``, as on
our development machines) can run the v2 plugin too, when asked (``cgroup="v2"`` or
``HARMONAIZE_SLURM_CGROUP=v2``), with one concession: Slurm 22.05's cgroup/v2 refuses to
start ("Hybrid mode is not supported") when the first line of its own
``/proc/self/cgroup`` is not the unified ``0::`` one, which it never is while any v1
hierarchy is mounted. slurmd then runs with ``native/cgroup_view`` preloaded, which
shows slurmd and slurmstepd that file's unified line alone; the cgroups, the freezing
and the tasks' own view are the kernel's. The v2 plugin needs no controller for
tracking (it freezes with ``cgroup.freeze``), so the controller-less cgroup2 of a hybrid
host is enough; Slurm logs "Controller cpuset is not enabled!" and goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CGROUP_ROOT = Path("/sys/fs/cgroup")
HYBRID_UNIFIED = CGROUP_ROOT / "unified"
FORCE_ENV = "HARMONAIZE_SLURM_CGROUP"
# Built by ./scripts/setup (make -C native).
UNIFIED_VIEW = Path(__file__).resolve().parents[1] / "native" / "build" / \
    "libhz-unified-cgroup-view.so"

Version = Literal["v1", "v2"]


@dataclass(frozen=True)
class CgroupLayout:
    """The plugin Slurm is told to use, and the host facts that go with it."""

    version: Version
    mountpoint: Path  # v1: the directory of the controllers; v2: the cgroup2 mount
    hybrid: bool = False  # v2 beside v1 hierarchies: slurmd needs the unified view

    def conf(self) -> str:
        """``cgroup.conf`` for this layout (keys of Slurm 22.05's cgroup.conf(5))."""
        lines = [f"CgroupPlugin=cgroup/{self.version}", f"CgroupMountpoint={self.mountpoint}"]
        if self.version == "v2":
            lines += ["IgnoreSystemd=yes", "CgroupAutomount=yes"]
        return "\n".join(lines) + "\n"

    def slurmd_env(self) -> dict[str, str]:
        """What slurmd's environment adds (slurmstepd inherits it; job tasks do not)."""
        return {"LD_PRELOAD": str(UNIFIED_VIEW)} if self.hybrid else {}

    @property
    def slice(self) -> Path:
        """v2: where Slurm puts each node's scope."""
        return self.mountpoint / "system.slice"

    def node_trees(self, node: str) -> list[Path]:
        """The top cgroup directories Slurm makes for ``node`` (existing or not)."""
        if self.version == "v2":
            return [self.slice / f"{node}_slurmstepd.scope"]
        controllers = sorted(p for p in self.mountpoint.iterdir()
                             if p.is_dir() and not p.is_symlink())
        return [controller / f"slurm_{node}" for controller in controllers]


def cgroup_mounts(mountinfo: str) -> dict[Path, tuple[str, set[str]]]:
    """Mount point -> (``cgroup``/``cgroup2``, super options) from /proc/self/mountinfo;
    the last mount at a point wins, as it hides those below it."""
    mounts: dict[Path, tuple[str, set[str]]] = {}
    for line in mountinfo.splitlines():
        fields, sep, tail = line.partition(" - ")
        parts, rest = fields.split(), tail.split()
        if not sep or len(parts) < 5 or len(rest) < 3:
            continue
        point = Path(parts[4].replace("\\040", " "))
        if rest[0] in ("cgroup", "cgroup2"):
            mounts[point] = (rest[0], set(rest[2].split(",")))
        else:
            mounts.pop(point, None)
    return mounts


def has_v1_hierarchies(self_cgroup: str) -> bool:
    """Whether /proc/self/cgroup names any v1 hierarchy (a line other than ``0::``)."""
    return any(line and not line.startswith("0::") for line in self_cgroup.splitlines())


def choose(mountinfo: str, self_cgroup: str, want: str | None = None,
           root: Path = CGROUP_ROOT, view: Path = UNIFIED_VIEW) -> CgroupLayout | str:
    """The layout to run Slurm in (``want``: ``v1``, ``v2`` or None for the host's own),
    or why none can be used (``view``: the built unified view, for hybrid hosts)."""
    if want not in (None, "", "v1", "v2"):
        return f"{FORCE_ENV}={want!r}: use v1 or v2"
    mounts = cgroup_mounts(mountinfo)
    freezer = mounts.get(root / "freezer")
    v1 = freezer is not None and freezer[0] == "cgroup" and "freezer" in freezer[1]
    v2_at = next((point for point in (root, root / "unified")
                  if mounts.get(point, ("", set()))[0] == "cgroup2"), None)
    if want == "v1" or (not want and v1):
        if v1:
            return CgroupLayout("v1", root)
        return "no cgroup v1 freezer hierarchy at " + str(root / "freezer")
    if v2_at is None:
        where = f"cgroup2 at {root} or {root / 'unified'}"
        return f"no {where}" if want else f"neither a cgroup v1 freezer hierarchy nor {where}"
    hybrid = has_v1_hierarchies(self_cgroup)
    if hybrid and not view.exists():
        return (f"cgroup v2 beside v1 hierarchies needs {view.name} "
                "(./scripts/setup builds it)")
    return CgroupLayout("v2", v2_at, hybrid=hybrid)


def host_layout(want: str | None = None) -> CgroupLayout | str:
    """:func:`choose` on this host; ``want`` defaults to $HARMONAIZE_SLURM_CGROUP."""
    if want is None:
        want = os.environ.get(FORCE_ENV)
    try:
        mountinfo = Path("/proc/self/mountinfo").read_text()
        self_cgroup = Path("/proc/self/cgroup").read_text()
    except OSError as exc:
        return f"cannot read this process's mounts or cgroups: {exc}"
    return choose(mountinfo, self_cgroup, want)


def kill_tasks(trees: Callable[[], Iterable[Path]]) -> None:
    """SIGKILL whatever runs in the cgroups ``trees()`` names (asked again each round:
    Slurm may make a directory meanwhile), until none is left or 2 s have passed."""
    for top in trees():
        # cgroup v2 (Linux 5.14+) kills a whole tree at once, frozen tasks too.
        with contextlib.suppress(OSError):
            (top / "cgroup.kill").write_text("1")
    for _attempt in range(20):
        pids: set[int] = set()
        for top in trees():
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(line) for line in procs.read_text().split())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_trees(trees: Iterable[Path]) -> None:
    """Remove empty cgroup trees; what still holds a task stays."""
    for top in trees:
        # Deepest first: a cgroup directory is removed with rmdir once it has none below.
        for path in sorted((p for p in top.rglob("*") if p.is_dir()),
                           key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                path.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()
