"""Issue 28, item 4: one tenant's bulk declaration takes neither another's bandwidth nor
its traffic. Real HTB classes and the real eBPF classifier in network namespaces, the
agent as on a host, iperf3 flows: a hostile declaration (a floor of 10,000,000 Mb/s, the
other job's port) leaves the other job's class and the collectives at their guarantees,
and the other job's flow in its own class."""

from __future__ import annotations

import grp
import pwd
import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbed.netns import Lab
from tests.agent.tuning.test_netns import DECLARATION, JOB, agent_in, declare, received_bps
from tests.conftest import needs_root
from tests.daemons import wait_until

pytestmark = [pytest.mark.hardening, pytest.mark.tuning, needs_root]



@dataclass(frozen=True)
class Tenant:
    group: str
    uid: int
    gid: int


@pytest.fixture
def tenants() -> Iterator[dict[str, Tenant]]:
    """Two tenant users, each with its job's Unix group as its primary group."""
    made: dict[str, Tenant] = {}
    try:
        for role in ("victim", "hostile"):
            name = f"hz{role[:3]}{uuid.uuid4().hex[:6]}"
            subprocess.run(["groupadd", name], check=True, capture_output=True)
            subprocess.run(["useradd", "-M", "-N", "-g", name, "-s", "/usr/sbin/nologin",
                            name], check=True, capture_output=True)
            made[role] = Tenant(name, pwd.getpwnam(name).pw_uid, grp.getgrnam(name).gr_gid)
        yield made
    finally:
        for tenant in made.values():
            subprocess.run(["userdel", tenant.group], check=False, capture_output=True)
            subprocess.run(["groupdel", tenant.group], check=False, capture_output=True)


@pytest.fixture
def lab(make_lab) -> Lab:
    return make_lab(["a", "b"], pair=True)


def classes(agent) -> dict[str, dict]:
    """The agent's classes on eth0, by what they carry."""
    rows = agent.request("jobs")["traffic_classes"]["classes"].get("eth0", [])
    return {row["for"]: row for row in rows}


def sent_bytes(lab: Lab) -> dict[str, int]:
    """Bytes each HTB class sent, by class id, as the kernel counts them."""
    out = lab.run("a", ["tc", "-s", "class", "show", "dev", "eth0"]).stdout
    found = re.findall(r"class htb (\S+) .*?\n\s*Sent (\d+) bytes", out)
    return {classid: int(sent) for classid, sent in found}


def flow_as(spawn, lab: Lab, tenant: Tenant, port: int) -> dict[str, int]:
    """A 2 s TCP flow from host a to b's ``port``, by the tenant's user; what each class
    sent meanwhile."""
    spawn(lab.cmd("b", ["iperf3", "-s", "-1", "-p", str(port)]), stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    before = sent_bytes(lab)
    client = spawn(lab.cmd("a", ["setpriv", f"--reuid={tenant.uid}", f"--regid={tenant.gid}",
                                 "--clear-groups", "iperf3", "-c", lab.addr("b"), "-p",
                                 str(port), "-t", "2", "-J"]),
                   stdout=subprocess.PIPE, text=True)
    assert received_bps(client) > 0
    after = sent_bytes(lab)
    return {c: after.get(c, 0) - before.get(c, 0) for c in after}


def test_item4_a_hostile_bulk_declaration_takes_no_bandwidth_and_no_flow(
        spawn, workdir: Path, lab: Lab, tenants: dict[str, Tenant]) -> None:
    victim_user, hostile_user = tenants["victim"], tenants["hostile"]
    agent = agent_in(spawn, workdir, lab)  # eth0: 40 Mb/s, collectives keep 10%
    # The victim: 10 Mb/s for its flows to port 5202; its group from its placement.
    declare(agent, {**DECLARATION, "group": victim_user.group})
    wait_until(lambda: f"bulk of {JOB}" in classes(agent), what="the victim's class")
    # The hostile job: a floor of 10,000,000 Mb/s, the victim's port, and DSCP 0 (what
    # every unmarked packet carries).
    declare(agent, {"job": "hostile", "revision": 1, "group": hostile_user.group,
                    "bulk": {"floor_mbps": 10_000_000, "ports": [5202], "dscp": [0]}})
    wait_until(lambda: "bulk of hostile" in classes(agent), what="the hostile class")
    rows = classes(agent)
    victim, hostile = rows[f"bulk of {JOB}"], rows["bulk of hostile"]
    collectives = rows["collectives and other traffic"]
    assert victim["rate_kbit"] == 10_000  # what it declared, untouched
    assert hostile["rate_kbit"] == 20_000  # tuning.bulk_floor_max_share of 40 Mb/s
    assert collectives["rate_kbit"] >= 4_000  # never below collective_share
    assert victim["rate_kbit"] + hostile["rate_kbit"] + collectives["rate_kbit"] == 40_000
    tc = lab.run("a", ["tc", "class", "show", "dev", "eth0"]).stdout  # the kernel agrees
    assert re.search(rf"class htb {victim['class']} .*rate 10Mbit ceil 40Mbit", tc), tc
    assert re.search(rf"class htb {hostile['class']} .*rate 20Mbit ceil 40Mbit", tc), tc
    notes = " ".join(agent.request("jobs")["traffic_classes"]["notes"])
    assert "job hostile's bulk floor 40 Mb/s cut to 20 Mb/s" in notes
    # The victim's flow goes to the victim's class, none of it to the hostile one's.
    grew = flow_as(spawn, lab, victim_user, 5202)
    assert grew[victim["class"]] > 1_000_000, grew
    assert grew.get(hostile["class"], 0) < 10_000, grew
    # The hostile job's own flow to the same port is its own class's (DSCP 0, its user).
    grew = flow_as(spawn, lab, hostile_user, 5202)
    assert grew[hostile["class"]] > 1_000_000, grew
    assert grew.get(victim["class"], 0) < 10_000, grew
