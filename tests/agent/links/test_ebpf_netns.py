"""Link observation for real: eBPF in network namespaces with iperf3 traffic."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.kernel.sysfs import DevCounters, parse_proc_net_dev
from testbed.dropper import Dropper
from testbed.netns import Lab
from tests.conftest import free_port, needs_root, python
from tests.daemons import Agent, start_agent, wait_until
from tests.ops.test_metrics import check_conventions, value

pytestmark = [pytest.mark.links, needs_root]

EBPF = ('[observers.links]\ninclude = ["eth0"]\nmode = "ebpf"\n'
        "speeds = { eth0 = 10000 }\n")


@pytest.fixture
def lab(make_lab) -> Lab:
    return make_lab(["a", "b"])


def agent_in(spawn, workdir: Path, lab: Lab, links: str = EBPF, name: str = "a") -> Agent:
    return start_agent(spawn, workdir, name, links=links, lab=lab, host="a")


def offloads_off(lab: Lab) -> None:
    # With segmentation offloads off a veth counts one packet per segment, like a NIC.
    for host in ("a", "b"):
        result = lab.run(host, ["ethtool", "-K", "eth0", "tso", "off", "gso", "off", "gro", "off"])
        assert result.returncode == 0, result.stderr


def iperf(lab: Lab, seconds: float = 2, tos: str | None = None, wait: bool = True,
          port: int = 5201, udp: str | None = None) -> subprocess.Popen[str]:
    """From a to b; ``udp``: a UDP flow at this rate (e.g. "200M") instead of TCP."""
    server = subprocess.Popen(lab.cmd("b", ["iperf3", "-s", "-1", "-p", str(port)]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    argv = ["iperf3", "-c", lab.addr("b"), "-p", str(port), "-t", str(seconds), "-J"]
    if tos:
        argv += ["-S", tos]
    if udp:
        argv += ["-u", "-b", udp]
    client = subprocess.Popen(lab.cmd("a", argv), stdout=subprocess.PIPE, text=True)
    if wait:
        out, _ = client.communicate(timeout=seconds + 30)
        assert client.returncode == 0, out
        server.wait(timeout=10)
    return client


def dev(lab: Lab) -> DevCounters:
    return parse_proc_net_dev(lab.run("a", ["cat", "/proc/net/dev"]).stdout)["eth0"]


def eth0(agent: Agent) -> dict:
    (link,) = agent.request("links")["links"]
    return link


def settled_totals(agent: Agent, gap: float = 0.25) -> dict:
    """Totals once two consecutive samples ``gap`` apart agree (no traffic in flight).

    Transmit is corrected by the root qdisc's counters once a second: after traffic
    through a qdisc, wait longer than that between the samples.
    """
    def stable() -> dict | None:
        first = eth0(agent)["totals"]
        time.sleep(gap)
        second = eth0(agent)["totals"]
        return second if first == second else None

    return wait_until(stable, what="the counters to settle")


def qdisc_stats(lab: Lab, host: str = "a") -> dict[str, dict]:
    """``tc -s qdisc`` of a host's eth0 by kind: the independent count."""
    out = lab.run(host, ["tc", "-s", "-j", "qdisc", "show", "dev", "eth0"]).stdout
    return {q["kind"]: q for q in json.loads(out)}


def our_filters(lab: Lab) -> list[str]:
    names = []
    for direction in ("ingress", "egress"):
        words = lab.run("a", ["tc", "filter", "show", "dev", "eth0", direction]).stdout.split()
        names += [after for word, after in itertools.pairwise(words) if word == "name"]
    return names


def test_ebpf_counts_agree_with_the_interface_counters(spawn, workdir: Path, lab: Lab) -> None:
    offloads_off(lab)
    agent = agent_in(spawn, workdir, lab)
    assert agent.request("links")["mode"] == "ebpf"
    before, dev_before = settled_totals(agent), dev(lab)
    iperf(lab, seconds=2)
    after, dev_after = settled_totals(agent), dev(lab)
    expected = {
        "rx_bytes": dev_after.rx_bytes - dev_before.rx_bytes,
        "tx_bytes": dev_after.tx_bytes - dev_before.tx_bytes,
        "rx_packets": dev_after.rx_packets - dev_before.rx_packets,
        "tx_packets": dev_after.tx_packets - dev_before.tx_packets,
    }
    assert expected["tx_bytes"] > 10_000_000
    for key, want in expected.items():
        got = after[key] - before[key]
        assert abs(got - want) <= 0.02 * want, (key, got, want)


def test_transmit_is_what_left_a_dropping_tbf(spawn, workdir: Path, lab: Lab) -> None:
    # Counted at clsact egress, before the root qdisc: a TBF that drops most of a UDP
    # flow must not make the agent report the dropped packets as sent.
    offloads_off(lab)
    agent = agent_in(spawn, workdir, lab)
    shaped = lab.run("a", ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
                           "50mbit", "burst", "32kb", "limit", "20kb"])
    assert shaped.returncode == 0, shaped.stderr
    time.sleep(1.5)  # the agent's next qdisc read sees the new root
    before, dev_before, tbf_before = settled_totals(agent, 1.2), dev(lab), qdisc_stats(lab)["tbf"]
    offered_before = sum(c["tx_bytes"] for c in eth0(agent)["traffic_classes"].values())
    iperf(lab, seconds=2, udp="200M")
    after, dev_after, tbf_after = settled_totals(agent, 1.2), dev(lab), qdisc_stats(lab)["tbf"]
    offered = sum(c["tx_bytes"] for c in eth0(agent)["traffic_classes"].values()) - offered_before
    dropped = tbf_after["drops"] - tbf_before["drops"]
    left_bytes = dev_after.tx_bytes - dev_before.tx_bytes
    left_packets = dev_after.tx_packets - dev_before.tx_packets
    assert dropped > left_packets, "the TBF should drop most of the flow"
    assert offered > 2 * left_bytes                       # what came to the qdisc
    # What left: against ip -s link (the driver) and tc -s (the TBF's "Sent").
    for got, want in ((after["tx_bytes"] - before["tx_bytes"], left_bytes),
                      (after["tx_packets"] - before["tx_packets"], left_packets),
                      (after["tx_bytes"] - before["tx_bytes"],
                       tbf_after["bytes"] - tbf_before["bytes"])):
        assert abs(got - want) <= max(0.002 * want, 300), (got, want)
    assert after["qdisc_drops"] - before["qdisc_drops"] == dropped
    link = eth0(agent)
    assert link["totals"]["qdisc_drops"] == after["qdisc_drops"]
    assert set(link["drops_per_s_by_source"]) == {"nic", "qdisc", "tc"}


def test_tc_drops_are_counted_per_link(spawn, workdir: Path, lab: Lab) -> None:
    agent = agent_in(spawn, workdir, lab)
    bpf = attach_dropper(lab, permille=100, host="a", direction="egress")
    before = settled_totals(agent, 1.2)
    # Plain datagrams, not iperf3: a test whose control connection loses packets can stall.
    sender = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
              f"for _ in range(2000):\n    s.sendto(b'x' * 100, ('{lab.addr('b')}', 9))\n")
    sent = lab.run("a", [sys.executable, "-c", sender])
    assert sent.returncode == 0, sent.stderr
    bpf.set(0)
    after = settled_totals(agent, 1.2)
    # The agent added the clsact at its start: its drop count is the link's tc drops.
    assert after["tc_drops"] == qdisc_stats(lab)["clsact"]["drops"]
    assert after["tc_drops"] - before["tc_drops"] > 50
    del bpf


def test_per_link_metrics_are_the_totals_by_node_exporters_names(
        spawn, workdir: Path, lab: Lab) -> None:
    port = free_port()
    agent = agent_in(spawn, workdir, lab,
                     links=EBPF + f'[metrics]\nlisten = "127.0.0.1:{port}"\n')
    iperf(lab, seconds=1, tos="0x20")
    settled_totals(agent, 1.2)
    scraper = ("import urllib.request\nprint(urllib.request.urlopen("
               f"'http://127.0.0.1:{port}/metrics', timeout=10).read().decode())")
    name = "harmonaize_agent_link"

    def consistent() -> tuple[dict, dict] | None:
        """A scrape between two equal reads of the totals (no stray packet between)."""
        before = eth0(agent)["totals"]
        families = check_conventions(lab.run("a", [sys.executable, "-c", scraper]).stdout)
        return (families, before) if eth0(agent)["totals"] == before else None

    families, totals = wait_until(consistent, what="a scrape with the totals standing still")
    for direction, short in (("receive", "rx"), ("transmit", "tx")):
        for field in ("bytes", "packets"):
            got = value(families, f"{name}_{field}_total", device="eth0", direction=direction)
            assert got == totals[f"{short}_{field}"] > 0, (field, direction)
    assert value(families, f"{name}_class_bytes_total", device="eth0", direction="transmit",
                 **{"class": "1"}) > 1_000_000
    assert value(families, f"{name}_drops_total", device="eth0", direction="transmit",
                 source="qdisc") == totals["qdisc_drops"]
    assert value(families, f"{name}_speed_bytes", device="eth0") == 10_000 * 125_000
    assert value(families, f"{name}_up", device="eth0") == 1
    assert value(families, f"{name}_congestion_level", device="eth0") in (0, 1, 2)
    assert value(families, "harmonaize_agent_bpf_programs_attached", hook="tc") == 2


def test_gso_packets_count_as_their_segments(spawn, workdir: Path, lab: Lab) -> None:
    # With offloads on, the veth counts a GSO super-packet once, unsegmented; we count
    # the segments and the bytes they take on a wire, so we count more of both.
    agent = agent_in(spawn, workdir, lab)
    before, dev_before = settled_totals(agent), dev(lab)
    iperf(lab, seconds=1)
    after, dev_after = settled_totals(agent), dev(lab)
    skbs = dev_after.tx_packets - dev_before.tx_packets
    segments = after["tx_packets"] - before["tx_packets"]
    assert segments > 2 * skbs
    payload_and_one_header = dev_after.tx_bytes - dev_before.tx_bytes
    wire = after["tx_bytes"] - before["tx_bytes"]
    assert payload_and_one_header < wire < 1.1 * payload_and_one_header


def test_two_tos_values_are_counted_in_two_classes(spawn, workdir: Path, lab: Lab) -> None:
    agent = agent_in(spawn, workdir, lab)
    iperf(lab, seconds=1, tos="0x20")   # DSCP 8  -> class 1 (CS1)
    iperf(lab, seconds=1, tos="0xb8")   # DSCP 46 -> class 5 (EF)
    settled_totals(agent)
    classes = eth0(agent)["traffic_classes"]
    assert classes["1"]["tx_bytes"] > 5_000_000
    assert classes["5"]["tx_bytes"] > 5_000_000
    total = eth0(agent)["totals"]["tx_bytes"]
    assert classes["1"]["tx_bytes"] + classes["5"]["tx_bytes"] > 0.95 * total


def attach_dropper(lab: Lab, permille: int, host: str = "a",
                   direction: str = "egress") -> Dropper:
    """The test-only dropping program on a host's eth0, behind the agent's filter."""
    return Dropper(lab, host, direction, permille)


def test_drops_and_retransmissions_are_reported(spawn, workdir: Path, lab: Lab) -> None:
    # Loss in the network: the receiver's ingress drops 5% of what a sends.
    agent = agent_in(spawn, workdir, lab)
    bpf = attach_dropper(lab, permille=50, host="b", direction="ingress")
    client = iperf(lab, seconds=6, wait=False)
    try:
        def lossy() -> dict | None:
            links = agent.request("links")
            link = links["links"][0]
            by_reason = links["drops_by_reason"].get("TC_INGRESS", {})
            if link["retransmits_per_s"] > 0 and by_reason.get("total", 0) > 0:
                return links
            return None

        wait_until(lossy, timeout=20, what="retransmits and TC_INGRESS drops")
        # About 5% is retransmitted: far above the 1% that makes congestion high.
        wait_until(lambda: eth0(agent)["congestion"] == "high", timeout=20,
                   what="high congestion")
        assert eth0(agent)["retransmit_fraction"] > 0.01
        conditions = {c["type"]: c for c in agent.request("status")["conditions"]}
        assert conditions["LinkCongested"]["status"] == "True"
        assert conditions["LinkCongested"]["message"] == "eth0"
    finally:
        client.wait(timeout=30)
    del bpf


def test_sigkill_then_restart_leaves_no_stale_filters(spawn, workdir: Path, lab: Lab) -> None:
    bpf = attach_dropper(lab, permille=0)  # someone else's filter, which we must not touch
    agent = agent_in(spawn, workdir, lab)
    assert sorted(our_filters(lab)) == ["hz_tc_e0", "hz_tc_i0", "test_drop"]
    agent.proc.send_signal(signal.SIGKILL)
    agent.proc.wait(timeout=10)
    assert sorted(our_filters(lab)) == ["hz_tc_e0", "hz_tc_i0", "test_drop"]
    agent = agent_in(spawn, workdir, lab)
    assert sorted(our_filters(lab)) == ["hz_tc_e0", "hz_tc_i0", "test_drop"]
    assert "removed filters left by a previous agent" in agent.log.read_text()
    before = settled_totals(agent)
    iperf(lab, seconds=1)
    assert settled_totals(agent)["tx_bytes"] > before["tx_bytes"] + 1_000_000
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=10) == 0
    assert our_filters(lab) == ["test_drop"]
    del bpf


def test_sigterm_removes_filters_and_the_clsact_we_added(spawn, workdir: Path, lab: Lab) -> None:
    agent = agent_in(spawn, workdir, lab)
    assert "clsact" in lab.run("a", ["tc", "qdisc", "show", "dev", "eth0"]).stdout
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.proc.wait(timeout=10) == 0
    assert our_filters(lab) == []
    assert "clsact" not in lab.run("a", ["tc", "qdisc", "show", "dev", "eth0"]).stdout


def test_proc_fallback_reports_utilization(spawn, workdir: Path, lab: Lab) -> None:
    links = EBPF.replace('mode = "ebpf"', 'mode = "proc"').replace("10000", "1000")
    agent = agent_in(spawn, workdir, lab, links=links)
    assert our_filters(lab) == []
    status = {o["name"]: o for o in agent.request("status")["observers"]}
    assert status["links"]["detail"] == "proc fallback: /proc counters by configuration"
    client = iperf(lab, seconds=4, wait=False)
    try:
        link = wait_until(lambda: (row := eth0(agent))["tx_utilization"] > 0.5 and row,
                          timeout=20, what="utilization from /proc")
        assert link["traffic_classes"] == {} and link["congestion"] == "high"
    finally:
        client.wait(timeout=30)


def test_auto_mode_falls_back_and_says_why(spawn, workdir: Path, lab: Lab) -> None:
    links = EBPF.replace('mode = "ebpf"', f'mode = "auto"\nbpf_dir = "{workdir}"')
    agent = agent_in(spawn, workdir, lab, links=links)
    detail = agent.request("links")["detail"]
    assert detail.startswith("proc fallback: BPF source") and "not found" in detail
    table = subprocess.run(python("harmonaize.harmonctl", "-s", str(agent.socket), "status"),
                           capture_output=True, text=True, timeout=30).stdout
    assert "proc fallback: BPF source" in table


def test_ebpf_mode_fails_the_observer_when_unavailable(spawn, workdir: Path, lab: Lab) -> None:
    links = EBPF + f'bpf_dir = "{workdir}"\n'
    agent = agent_in(spawn, workdir, lab, links=links)
    status = {o["name"]: o for o in agent.request("status")["observers"]}
    assert status["links"]["state"] == "failed"
    assert "eBPF required but unavailable" in status["links"]["detail"]
    assert agent.request("status")["health"] == "degraded"


def test_check_mode_attaches_reports_and_detaches(workdir: Path, lab: Lab) -> None:
    config = workdir / "check.toml"
    config.write_text("[agent]\nlog_level = 'warning'\n" + EBPF)
    result = lab.run("a", python("agent.main", "-c", str(config), "--check", "--json"))
    assert result.returncode == 0, result.stderr
    (links,) = [o for o in json.loads(result.stdout)["observers"] if o["name"] == "links"]
    assert links["state"] == "running" and links["detail"].startswith("eBPF on 1 interface")
    assert our_filters(lab) == []


def test_harmonctl_links_table_and_json(spawn, workdir: Path, lab: Lab) -> None:
    agent = agent_in(spawn, workdir, lab)
    argv = python("harmonaize.harmonctl", "-s", str(agent.socket), "links")
    table = subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout
    assert "LINK" in table and "eth0" in table and "links: running (ebpf)" in table
    parsed = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True,
                                       timeout=30).stdout)
    assert parsed["links"][0]["name"] == "eth0" and parsed["classes"][0]["link_class"] == "data"
