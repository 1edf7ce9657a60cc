"""Hosts made of network namespaces on one bridge, for the demo and the tests.

    with Lab(["controller", "h1", "h2", "tenant"]) as lab:
        lab.popen("h1", ["harmonaize-agent", ...])

Each host is a namespace with an ``eth0`` on a private subnet; the bridge sits
in a namespace of its own, so nothing is added to the caller's namespace.
Everything (processes, namespaces, their veths) is removed on exit, and a lab
left behind by a killed run is removed by the next one.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

PREFIX = "hzlab"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


def namespaces() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def remove_stale() -> list[str]:
    """Delete labs whose owning process is gone (names carry the owner's pid)."""
    removed = []
    for name in namespaces():
        parts = name.split("-")
        if len(parts) < 3 or parts[0] != PREFIX or not parts[1].isdigit():
            continue
        pid = int(parts[1])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
            removed.append(name)
        except PermissionError:
            pass
    return removed


def _kill_namespace_processes(ns: str) -> None:
    pids = _ip("netns", "pids", ns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


class Lab:
    def __init__(
        self,
        hosts: Sequence[str],
        *,
        subnet: str = "10.231.0.0/24",
        tag: str | None = None,
        pair: bool = False,
    ) -> None:
        """``pair=True`` joins exactly two hosts by one veth pair, with no bridge between."""
        if os.geteuid() != 0:
            raise PermissionError("network namespaces need root")
        if pair and len(hosts) != 2:
            raise ValueError("a pair needs exactly two hosts")
        self.pair = pair
        self.hosts = list(hosts)
        self.tag = f"{os.getpid()}-{tag or format(time.monotonic_ns() % 100000, 'x')}"
        self.net = ipaddress.ip_network(subnet)
        self.switch = f"{PREFIX}-{self.tag}-sw"
        self._addresses = {
            host: str(self.net.network_address + 1 + i) for i, host in enumerate(self.hosts)
        }
        self._procs: list[subprocess.Popen[Any]] = []
        self._created: list[str] = []

    def ns(self, host: str) -> str:
        return f"{PREFIX}-{self.tag}-{host}"

    def addr(self, host: str) -> str:
        return self._addresses[host]

    def __enter__(self) -> Lab:
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def create(self) -> None:
        remove_stale()
        names = [self.ns(h) for h in self.hosts] if self.pair else [
            self.switch, *(self.ns(h) for h in self.hosts)]
        for name in names:
            _ip("netns", "add", name)
            self._created.append(name)
            _ip("-n", name, "link", "set", "lo", "up")
        if self.pair:
            first, second = self.hosts
            _ip("-n", self.ns(first), "link", "add", "eth0", "type", "veth",
                "peer", "name", "eth0", "netns", self.ns(second))
            for host in self.hosts:
                self._address(host)
            return
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for i, host in enumerate(self.hosts):
            port = f"p{i}"
            _ip("-n", self.switch, "link", "add", port, "type", "veth",
                "peer", "name", "eth0", "netns", self.ns(host))
            _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
            self._address(host)

    def _address(self, host: str) -> None:
        _ip("-n", self.ns(host), "addr", "add",
            f"{self.addr(host)}/{self.net.prefixlen}", "dev", "eth0")
        _ip("-n", self.ns(host), "link", "set", "eth0", "up")

    def cut(self, host: str, *, off: bool = True) -> None:
        """Cut ``host`` off the lab's switch (a partition), or (``off=False``) join it
        again; its own namespace stays as it is."""
        if self.pair:
            raise ValueError("a pair has no switch to cut a host off")
        port = f"p{self.hosts.index(host)}"
        _ip("-n", self.switch, "link", "set", port, "down" if off else "up")

    def cmd(self, host: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def run(
        self, host: str, argv: Sequence[str], **kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.cmd(host, argv), check=False, **kwargs)

    def popen(
        self,
        host: str,
        argv: Sequence[str],
        *,
        log: Path | None = None,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
        env: dict[str, str] | None = None,
        text: bool = False,
    ) -> subprocess.Popen[Any]:
        out: int | IO[Any] | None = stdout
        if log is not None:
            out = log.open("ab")
        proc = subprocess.Popen(
            self.cmd(host, argv),
            stdout=out,
            stderr=subprocess.STDOUT if log is not None else stderr,
            env=env,
            text=text,
            start_new_session=True,  # Ctrl-C on the demo reaches us, not the daemons
        )
        if log is not None and hasattr(out, "close"):
            out.close()  # type: ignore[union-attr]
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        for name in reversed(self._created):
            _kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
        self._created.clear()
