"""Integration tests whose hosts are network namespaces (default) or Vagrant VMs (--vagrant).

The same tests, two kinds of host: in namespaces the daemons are processes of
this test run; in the VMs they are the installed systemd services, hardened
as shipped. Each kind answers the same few questions through :class:`Hosts`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from testbed.cluster import TestCluster
from tests.conftest import ROOT, needs_root

pytestmark = pytest.mark.ops

AGENTS = ("h1", "h2")
AGENT_METRICS = "127.0.0.1:9480"
SCRAPE = ("import sys, urllib.request; "
          "sys.stdout.write(urllib.request.urlopen(f'http://{sys.argv[1]}/metrics', "
          "timeout=10).read().decode())")


class Hosts:
    """A controller and two agent hosts, whatever they run on."""

    __test__ = False

    def run(self, host: str, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        raise NotImplementedError

    def harmonctl(self, host: str, *args: str) -> Any:
        raise NotImplementedError

    def stop_agent(self, host: str) -> None:
        raise NotImplementedError

    def start_agent(self, host: str) -> None:
        raise NotImplementedError

    def python(self) -> str:
        raise NotImplementedError

    def metrics(self, host: str) -> dict[str, Any]:
        done = self.run(host, [self.python(), "-c", SCRAPE, AGENT_METRICS])
        assert done.returncode == 0, done.stderr
        return {f.name: f for f in text_string_to_metric_families(done.stdout)}


class NamespaceHosts(Hosts):
    def __init__(self, cluster: TestCluster) -> None:
        self.cluster = cluster

    def run(self, host: str, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.cluster.lab.cmd(host, list(argv)), capture_output=True,
                              text=True, timeout=120)

    def harmonctl(self, host: str, *args: str) -> Any:
        socket = (["-C", str(self.cluster.admin_socket)] if host == "controller"
                  else ["-s", str(self.cluster.socket(host))])
        done = subprocess.run([sys.executable, "-m", "harmonaize.harmonctl", *socket, *args,
                               "--json"], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def stop_agent(self, host: str) -> None:
        assert self.cluster.stop_agent(host) == 0

    def start_agent(self, host: str) -> None:
        self.cluster.start_agent(host, gpus=0, extra=f'[metrics]\nlisten = "{AGENT_METRICS}"\n')

    def python(self) -> str:
        return sys.executable


class VmHosts(Hosts):
    def __init__(self, workdir: Path) -> None:
        from testbed.vagrant import VagrantCluster  # noqa: PLC0415 - VMs only

        self.vms = VagrantCluster(ROOT, workdir)

    def run(self, host: str, argv: Sequence[str],
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.vms.run(host, argv, timeout=timeout)

    def harmonctl(self, host: str, *args: str) -> Any:
        done = self.run(host, ["harmonctl", *(["-C"] if host == "controller" else []), *args,
                               "--json"])
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def stop_agent(self, host: str) -> None:
        done = self.run(host, ["systemctl", "stop", "harmonaize-agent"])
        assert done.returncode == 0, done.stderr

    def start_agent(self, host: str) -> None:
        # For Type=notify, start returns once the agent sent READY=1.
        done = self.run(host, ["systemctl", "start", "harmonaize-agent"])
        assert done.returncode == 0, done.stderr

    def python(self) -> str:
        return "/usr/bin/python3"


@pytest.fixture
def hosts(host_kind: str, workdir: Path, request: pytest.FixtureRequest) -> Iterator[Hosts]:
    if host_kind == "vagrant":
        vm_hosts = VmHosts(workdir)
        yield vm_hosts
        for host in AGENTS:  # leave every agent running, as provisioning did
            vm_hosts.start_agent(host)
        return
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    lab = request.getfixturevalue("make_lab")(["controller", *AGENTS])
    cluster = TestCluster(lab, workdir)
    cluster.start_controller()
    ns_hosts = NamespaceHosts(cluster)
    for host in AGENTS:
        ns_hosts.start_agent(host)
    yield ns_hosts
    for host in list(cluster.agents):
        cluster.stop_agent(host)


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.5)


def alive(hosts: Hosts) -> dict[str, bool]:
    return {h["host_id"]: h["alive"] for h in hosts.harmonctl("controller", "hosts")}


@needs_root
def test_hosts_join_leave_and_rejoin_the_controller(hosts: Hosts) -> None:
    wait_for(lambda: alive(hosts) == {"h1": True, "h2": True}, 120, "both hosts alive")
    status = hosts.harmonctl("h1", "status")
    assert status["ready"] and status["host_id"] == "h1"
    assert status["uplink"]["acked_seq"] > 0

    hosts.stop_agent("h2")
    wait_for(lambda: alive(hosts) == {"h1": True, "h2": False}, 120, "h2 down")
    (h2,) = [h for h in hosts.harmonctl("controller", "hosts") if h["host_id"] == "h2"]
    assert h2["down_reason"]
    hosts.start_agent("h2")
    wait_for(lambda: alive(hosts) == {"h1": True, "h2": True}, 120, "h2 back")


@needs_root
def test_every_agent_host_serves_its_metrics(hosts: Hosts) -> None:
    for host in AGENTS:
        families = wait_for(
            lambda h=host: (f := hosts.metrics(h)) and any(
                s.value > 0 for s in f["harmonaize_agent_uplink_messages_acked"].samples) and f,
            120, f"{host}'s acknowledged messages in its metrics")
        (ready,) = families["harmonaize_agent_ready"].samples
        assert ready.value == 1


def test_vm_agents_are_hardened_services(host_kind: str, workdir: Path) -> None:
    if host_kind != "vagrant":
        pytest.skip("systemd runs the daemons only in the VMs (--vagrant)")
    vms = VmHosts(workdir)
    for host in AGENTS:
        show = vms.run(host, ["systemctl", "show", "harmonaize-agent", "--property=ActiveState",
                              "--property=MainPID", "--property=NRestarts"])
        state = dict(line.split("=", 1) for line in show.stdout.split())
        assert state["ActiveState"] == "active" and state["NRestarts"] == "0", state
        caps = vms.run(host, ["grep", "^CapBnd", f"/proc/{state['MainPID']}/status"])
        # CAP_DAC_READ_SEARCH, CAP_NET_ADMIN, CAP_SYS_PTRACE, CAP_PERFMON, CAP_BPF
        assert int(caps.stdout.split()[1], 16) == sum(1 << b for b in (2, 12, 19, 38, 39))
        status = vms.harmonctl(host, "status")
        links = {o["name"]: o for o in status["observers"]}["links"]
        # eBPF on the VM's NICs, under the unit's sandbox and capability set.
        assert links["state"] == "running" and "eBPF on" in links["detail"], links
    show = vms.run("controller", ["systemctl", "show", "harmonaize-controller",
                                  "--property=ActiveState", "--property=User"])
    assert "ActiveState=active" in show.stdout and "User=harmonaize" in show.stdout


def test_the_ops_suite_passes_inside_a_vm(host_kind: str, workdir: Path) -> None:
    """Where systemd is the init system, the agent also runs as a transient hardened unit."""
    if host_kind != "vagrant":
        pytest.skip("needs a VM with systemd as init (--vagrant)")
    vms = VmHosts(workdir)
    done = vms.run("h1", ["sh", "-c", "cd /vagrant && .venv/bin/python -m pytest -q "
                          "-p no:cacheprovider -m ops tests/ops/test_lifecycle.py "
                          "tests/ops/test_units.py -rs"], timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "skipped" not in done.stdout.splitlines()[-1], done.stdout[-2000:]
