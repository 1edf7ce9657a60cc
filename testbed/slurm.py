"""A throwaway Slurm cluster on this machine, for the scheduler tests and benchmarks.

Real ``munged``, ``slurmctld`` and one ``slurmd`` per node name (Slurm's multiple-slurmd
mode: every node is this host, each on its own port), Debian's ``slurm-wlm`` and
``munge``, with a generated ``slurm.conf`` in a temporary directory. Everything it
started is stopped on :meth:`SlurmCluster.stop`, also when starting failed half way:
the daemons, the job steps they left (found through the cgroups Slurm made for our node
names, since ``slurmstepd`` detaches from ``slurmd``), those cgroups, the directory.
Needs root (``slurmd`` runs jobs as their users).

Jobs run under Slurm's cgroup/v1 plugin where the host has a v1 freezer hierarchy, else
under cgroup/v2 where cgroup2 is mounted at /sys/fs/cgroup (a fresh systemd host);
``cgroup="v1"``/``"v2"`` or ``HARMONAIZE_SLURM_CGROUP`` chooses. The layouts, what
Slurm makes in each, and how a hybrid host runs v2 are in :mod:`.cgroups`.

Node names are the caller's; by default they carry a random prefix, because Slurm
names its cgroups after the node (``/slurm_<node>/...`` in v1,
``system.slice/<node>_slurmstepd.scope`` in v2) and two clusters on one machine with
the same node names would share them.
``slurm.conf``'s text is in :mod:`.slurmconf`.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from testbed.cgroups import (
    CGROUP_ROOT,  # noqa: F401 (callers read it here)
    CgroupLayout,
    host_layout,
    kill_tasks,
    remove_trees,
)
from testbed.cluster import Timeout, wait_until
from testbed.slurmconf import SLURM_USER, slurm_conf

MUNGE_USER = "munge"


class SlurmError(RuntimeError):
    """The cluster could not start, or a client command failed."""


def missing(cgroup: str | None = None) -> str | None:
    """Why a cluster cannot be started here (in the ``cgroup`` layout: ``v1``, ``v2``,
    None for $HARMONAIZE_SLURM_CGROUP or the host's own), or None when it can."""
    if os.geteuid() != 0:
        return "needs root"
    for program in ("munged", "slurmctld", "slurmd", "scontrol", "srun", "sbatch"):
        if shutil.which(program) is None and not Path("/usr/sbin", program).exists():
            return f"no {program}: install slurm-wlm and munge (./scripts/setup)"
    for user in (SLURM_USER, MUNGE_USER):
        try:
            pwd.getpwnam(user)
        except KeyError:
            return f"no user {user!r}: install slurm-wlm and munge"
    layout = host_layout(cgroup)
    return layout if isinstance(layout, str) else None


def _program(name: str) -> str:
    found = shutil.which(name)
    if found is None and Path("/usr/sbin", name).exists():
        found = str(Path("/usr/sbin", name))
    if found is None:
        raise SlurmError(f"no {name} on this machine")
    return found


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports free right now (held open together so none repeats)."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _chown(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    os.chown(path, entry.pw_uid, entry.pw_gid)


class SlurmCluster:
    """munged + slurmctld + one slurmd per node, all on 127.0.0.1.

    ``extra_conf`` lines are appended to ``slurm.conf`` (``PrologSlurmctld=...``,
    ``EpilogSlurmctld=...``, ``RebootProgram=...``, more ``PartitionName=...``). Clients
    run with :attr:`env` (it names the configuration in ``SLURM_CONF``). ``cgroup``
    (``v1``, ``v2``) overrides the layout :func:`missing` would pick.
    """

    def __init__(self, nodes: Sequence[str] | None = None, *, count: int = 2,
                 cpus: int = 2, partition: str = "gpu",
                 extra_conf: Sequence[str] = (), node_extra: str = "",
                 base: Path | None = None, cgroup: str | None = None) -> None:
        layout = host_layout(cgroup)
        if isinstance(layout, str):
            raise SlurmError(f"no cgroup layout for Slurm: {layout}")
        self.cgroups: CgroupLayout = layout
        self._made_slice = False
        if nodes is None:
            prefix = "hz" + secrets.token_hex(2)
            nodes = [f"{prefix}n{index + 1}" for index in range(count)]
        self.nodes = list(nodes)
        self.cpus = cpus
        self.partition = partition
        self.extra_conf = list(extra_conf)
        self.node_extra = node_extra
        self.hostname = socket.gethostname()
        self.dir = Path(tempfile.mkdtemp(prefix="hz-slurm-", dir=base))
        self.dir.chmod(0o755)  # slurmctld runs as the slurm user and reads below here
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "sock"
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._stopped = False

    # -- lifecycle -------------------------------------------------------------------

    def __enter__(self) -> SlurmCluster:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    @property
    def env(self) -> dict[str, str]:
        """The environment for Slurm clients (srun, sbatch, scontrol, squeue)."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def log(self, name: str) -> Path:
        """A daemon's log file: ``slurmctld``, ``munged`` or a node name (its slurmd)."""
        if name == "slurmctld":
            return self.dir / "log" / "slurmctld.log"
        if name == "munged":
            return self.dir / "munge" / "log" / "munged.log"
        return self.dir / "log" / f"slurmd-{name}.log"

    def start(self) -> None:
        self._start_munge()
        ports = free_ports(1 + len(self.nodes))
        self.ctld_port = ports[0]
        self.node_ports = dict(zip(self.nodes, ports[1:], strict=True))
        self._write_conf()
        self._start_controller()
        for node in self.nodes:
            self._spawn(node, [_program("slurmd"), "-D", "-f", str(self.conf), "-N", node],
                        extra_env=self.cgroups.slurmd_env())
        self.wait_node_state(self.nodes, {"idle"}, timeout=60.0)

    def restart_controller(self) -> None:
        """Stop and start slurmctld (new nodes or conf lines need it: reconfigure refuses)."""
        self._terminate("slurmctld")
        self._write_conf()
        self._start_controller()

    def stop(self) -> None:
        """Stop everything started, remove what Slurm left; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        for name in [*self.nodes, "slurmctld"]:
            self._terminate(name)
        self._kill_job_steps()
        self._terminate("munged")
        self._remove_cgroups()
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- clients ---------------------------------------------------------------------

    def run(self, program: str, *args: str, timeout: float = 60.0,
            check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """A Slurm client with this cluster's configuration; a failure raises SlurmError."""
        kwargs.setdefault("env", self.env)
        try:
            done = subprocess.run([program, *args], check=False, capture_output=True,
                                  text=True, timeout=timeout, **kwargs)
        except subprocess.TimeoutExpired as exc:
            raise SlurmError(f"{program} {' '.join(args)}: no answer in {timeout:g} s") from exc
        if check and done.returncode != 0:
            raise SlurmError(f"{program} {' '.join(args)}: exit {done.returncode}: "
                             f"{(done.stderr or done.stdout).strip()}")
        return done

    def scontrol(self, *args: str, timeout: float = 30.0) -> str:
        return self.run("scontrol", *args, timeout=timeout).stdout

    def srun(self, *args: str, timeout: float = 60.0, **kwargs: Any) -> str:
        return self.run("srun", *args, timeout=timeout, **kwargs).stdout

    def sbatch(self, *args: str, script: str | None = None) -> str:
        """Submit a batch job; its id. ``script`` is the batch script's text."""
        extra = {"input": script} if script is not None else {}
        # The job's output goes to this cluster's directory, not the caller's.
        output = () if any(a.startswith(("-o", "--output")) for a in args) else (
            f"--output={self.dir}/job-%j.out",)
        out = self.run("sbatch", "--parsable", *output, *args, **extra).stdout.strip()
        return out.split(";")[0]

    def node(self, name: str) -> dict[str, str]:
        """``scontrol show node`` as a dict of its key=value fields (``Reason`` whole)."""
        text = self.scontrol("show", "node", "--oneliner", name)
        return parse_fields(text)

    def job(self, job_id: str) -> dict[str, str] | None:
        done = self.run("scontrol", "show", "job", "--oneliner", job_id, check=False)
        if done.returncode != 0:
            return None
        return parse_fields(done.stdout)

    def node_state(self, name: str) -> str:
        return self.node(name).get("State", "").lower()

    def wait_node_state(self, nodes: Sequence[str] | str, states: set[str] | str,
                        timeout: float = 30.0) -> None:
        """Until every node's base state (``idle`` of ``IDLE+DRAIN``...) or any of its
        flags is in ``states``."""
        names = [nodes] if isinstance(nodes, str) else list(nodes)
        wanted = {states.lower()} if isinstance(states, str) else {s.lower() for s in states}

        def reached() -> bool:
            for name in names:
                parts = set(self.node_state(name).split("+"))
                if not parts & wanted:
                    return False
            return True

        self.wait(reached, timeout, f"nodes {names} in {sorted(wanted)}")

    def wait_job_state(self, job_id: str, states: set[str] | str,
                       timeout: float = 60.0) -> str:
        wanted = {states.upper()} if isinstance(states, str) else {s.upper() for s in states}

        def reached() -> str | None:
            job = self.job(job_id)
            state = (job or {}).get("JobState", "")
            return state if state in wanted else None

        return self.wait(reached, timeout, f"job {job_id} in {sorted(wanted)}")

    def wait(self, predicate: Callable[[], Any], timeout: float, what: str) -> Any:
        try:
            return wait_until(predicate, timeout, what, interval=0.1)
        except Timeout:
            raise SlurmError(f"timed out waiting for {what}; {self._dead()}") from None

    # -- internals -------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], extra_env: dict[str, str] | None = None,
               **kwargs: Any) -> None:
        out = (self.dir / "log" / f"{name}.out").open("wb")
        try:
            self._procs[name] = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "SLURM_CONF": str(self.conf), **(extra_env or {})},
                **kwargs)
        finally:
            out.close()

    def _dead(self) -> str:
        dead = [f"{name} exited {proc.returncode}" for name, proc in self._procs.items()
                if proc.poll() is not None]
        return ", ".join(dead) or "all daemons running"

    def _start_munge(self) -> None:
        munge = self.dir / "munge"
        (munge / "log").mkdir(parents=True)
        # The socket's directory must be reachable by the slurm user's daemons.
        munge.chmod(0o755)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        for path in (munge, munge / "log", key):
            _chown(path, MUNGE_USER)
        (self.dir / "log").mkdir()
        _chown(self.dir / "log", SLURM_USER)  # slurmctld writes its log as slurm
        self._spawn("munged", [
            _program("munged"), "-F", "-f", f"--socket={self.munge_socket}",
            f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
            f"--log-file={munge / 'log' / 'munged.log'}",
            f"--seed-file={munge / 'munged.seed'}", "--num-threads=4"])
        self.wait(self.munge_socket.exists, 20.0, "munged's socket")

    def _write_conf(self) -> None:
        state = self.dir / "state"
        state.mkdir(exist_ok=True)
        _chown(state, SLURM_USER)
        (self.dir / "spool").mkdir(exist_ok=True)
        (self.dir / "run").mkdir(exist_ok=True)
        self.conf.write_text(slurm_conf(
            hostname=self.hostname, ctld_port=self.ctld_port, munge_socket=self.munge_socket,
            directory=self.dir, nodes={node: self.node_ports[node] for node in self.nodes},
            cpus=self.cpus, node_extra=self.node_extra, partition=self.partition,
            extra=self.extra_conf))
        (self.dir / "cgroup.conf").write_text(self.cgroups.conf())
        if self.cgroups.version == "v2" and not self.cgroups.slice.is_dir():
            # Slurm 22.05 makes only its scope below the slice systemd would have made.
            with contextlib.suppress(FileExistsError):
                self.cgroups.slice.mkdir()
                self._made_slice = True

    def _start_controller(self) -> None:
        # -i: ignore state left by an earlier run of this directory's controller.
        self._spawn("slurmctld", [_program("slurmctld"), "-D", "-i", "-f", str(self.conf)])

        def answers() -> bool:
            if self._procs["slurmctld"].poll() is not None:
                raise SlurmError(f"slurmctld exited: {self._tail('slurmctld')}")
            done = self.run("scontrol", "ping", check=False, timeout=10)
            return done.returncode == 0 and "UP" in done.stdout

        self.wait(answers, 30.0, "slurmctld to answer")

    def _tail(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return self.log(name).read_text(errors="replace")[-2000:]
        return "(no log)"

    def _terminate(self, name: str) -> None:
        proc = self._procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def _our_cgroups(self) -> Iterator[Path]:
        """Slurm's cgroup directories for our node names (every v1 controller's, or the
        v2 scopes)."""
        for node in self.nodes:
            yield from (top for top in self.cgroups.node_trees(node) if top.is_dir())

    def _kill_job_steps(self) -> None:
        """SIGKILL whatever still runs in our nodes' cgroups (slurmstepd and its tasks)."""
        kill_tasks(self._our_cgroups)

    def _remove_cgroups(self) -> None:
        remove_trees(list(self._our_cgroups()))
        if self._made_slice:
            # Only when empty: another cluster on this machine may have a scope in it.
            with contextlib.suppress(OSError):
                self.cgroups.slice.rmdir()


def parse_fields(text: str) -> dict[str, str]:
    """``Key=value Key=value ...`` of ``scontrol show --oneliner``; ``Reason`` (free text,
    always last among the fields that may hold spaces) is kept whole."""
    fields: dict[str, str] = {}
    text = text.strip()
    reason_at = text.find(" Reason=")
    tail = ""
    if reason_at >= 0:
        text, tail = text[:reason_at], text[reason_at + 1:]
    for token in text.split():
        key, sep, value = token.partition("=")
        if sep:
            fields[key] = value
    if tail:
        fields["Reason"] = tail[len("Reason="):]
    return fields


@contextlib.contextmanager
def slurm_cluster(nodes: Sequence[str] | None = None, **kwargs: Any) -> Iterator[SlurmCluster]:
    """A started :class:`SlurmCluster`, stopped on exit whatever happened."""
    with SlurmCluster(nodes, **kwargs) as cluster:
        yield cluster
