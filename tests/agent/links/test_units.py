"""Link and RDMA observation without root: parsers, selection, levels, fixture trees."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent.kernel.sysfs import NetDevice, parse_proc_net_dev, parse_snmp
from agent.kernel.tracefs import parse_format
from agent.links.health import LevelHold, LinkHealthEngine, LinkView, congestion_of, errors_of
from agent.links.observer import select
from agent.links.settings import LinksSection
from agent.observers.base import FeatureAbsent
from agent.rdma.observer import RdmaObserver, counter_delta
from agent.rdma.settings import RdmaSection
from harmonaize.messages import Level
from tests.conftest import FIXTURES

pytestmark = pytest.mark.links

PROC_NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop ...
    lo: 5180 52 0 0 0 0 0 0 5180 52 0 0 0 0 0 0
  eth0: 123456789 98765 1 2 0 0 0 0 987654321 56789 3 4 0 0 0 0
broken line without numbers
  eth1: 1 2 3
"""


def test_proc_net_dev() -> None:
    parsed = parse_proc_net_dev(PROC_NET_DEV)
    assert set(parsed) == {"lo", "eth0"}
    eth0 = parsed["eth0"]
    rx = (eth0.rx_bytes, eth0.rx_packets, eth0.rx_errors, eth0.rx_drops)
    tx = (eth0.tx_bytes, eth0.tx_packets, eth0.tx_errors, eth0.tx_drops)
    assert rx == (123456789, 98765, 1, 2) and tx == (987654321, 56789, 3, 4)


def test_snmp_and_netstat() -> None:
    text = ("Tcp: RtoAlgorithm RetransSegs InErrs\nTcp: 1 42 0\n"
            "IpExt: InNoRoutes InCEPkts\nIpExt: 0 7\nMismatch: A\nOther: 1\n")
    parsed = parse_snmp(text)
    assert parsed["Tcp"]["RetransSegs"] == 42 and parsed["IpExt"]["InCEPkts"] == 7
    assert "Mismatch" not in parsed


def test_tracepoint_formats_give_offsets_and_reason_names() -> None:
    kfree = parse_format((FIXTURES / "kfree_skb.format").read_text())
    assert kfree.offset("reason") == 36 and kfree.offset("protocol") == 32
    reasons = kfree.symbols("reason")
    assert reasons[2] == "NOT_SPECIFIED" and "TC_EGRESS" in reasons.values()
    retx = parse_format((FIXTURES / "tcp_retransmit_skb.format").read_text())
    assert (retx.offset("family"), retx.offset("daddr"), retx.offset("daddr_v6")) == (32, 38, 58)
    assert parse_format("garbage").fields == {}
    assert kfree.symbols("nonexistent") == {}


def dev(name: str, physical: bool = False, rdma: bool = False) -> NetDevice:
    return NetDevice(name, 1, 1, physical, rdma, "up")


def test_interface_selection() -> None:
    devices = [dev("lo"), dev("eth0", physical=True), dev("ib0", rdma=True), dev("veth1"),
               dev("docker0"), dev("eth1", physical=True)]
    names = lambda cfg: [d.name for d in select(devices, cfg)]  # noqa: E731
    assert names(LinksSection()) == ["eth0", "ib0", "eth1"]
    assert names(LinksSection(exclude=("eth1",))) == ["eth0", "ib0"]
    assert names(LinksSection(include=("veth*", "lo"))) == ["veth1"]
    assert names(LinksSection(include_virtual=True)) == ["eth0", "ib0", "veth1", "docker0", "eth1"]


def view(util: float | None = 0.0, ce: float = 0.0, retx: float = 0.0, loss: float = 0.0,
         up: bool = True, name: str = "eth0", cls: str = "data", pps: float = 1e5) -> LinkView:
    return LinkView(name, cls, up, util, ce, retx, loss, pps)


def test_congestion_and_error_levels_follow_thresholds() -> None:
    cfg = LinksSection()
    assert congestion_of(view(0.5), cfg) is Level.NONE
    assert congestion_of(view(0.7), cfg) is Level.LOW
    assert congestion_of(view(0.9), cfg) is Level.HIGH
    assert congestion_of(view(None, ce=0.02), cfg) is Level.HIGH
    assert congestion_of(view(0.1, retx=0.002), cfg) is Level.LOW
    # One retransmission among forty packets is noise, not congestion.
    assert congestion_of(view(0.0, retx=0.25, pps=40), cfg) is Level.NONE
    assert errors_of(view(loss=0.0), cfg) is Level.NONE
    assert errors_of(view(loss=1e-6), cfg) is Level.LOW
    assert errors_of(view(loss=0.05), cfg) is Level.HIGH


def test_levels_rise_at_once_and_fall_after_the_hold() -> None:
    hold = LevelHold(hold=2.0)
    assert hold.update(Level.HIGH, 0.0) is Level.HIGH
    assert hold.update(Level.NONE, 0.5) is Level.HIGH
    assert hold.update(Level.HIGH, 1.0) is Level.HIGH   # the fall restarts
    assert hold.update(Level.LOW, 1.5) is Level.HIGH
    assert hold.update(Level.LOW, 3.4) is Level.HIGH
    assert hold.update(Level.NONE, 3.5) is Level.LOW
    assert hold.update(Level.NONE, 5.5) is Level.NONE


def test_link_engine_aggregates_per_class_and_reports_findings() -> None:
    engine = LinkHealthEngine(LinksSection(hold=0.0))
    step = engine.step([view(0.9, name="eth0"), view(0.1, name="eth1"),
                        view(0.0, up=False, name="eth2", cls="storage")], 0.0)
    by_class = {h.link_class: h for h in step.health}
    assert (by_class["data"].links, by_class["data"].congestion) == (2, Level.HIGH)
    assert (by_class["storage"].links_down, by_class["storage"].congestion) == (1, Level.NONE)
    findings = {f.type: f for f in step.findings}
    assert findings["LinkDown"].holds and findings["LinkDown"].message == "eth2"
    assert findings["LinkCongested"].holds and findings["LinkCongested"].message == "eth0"


def test_counter_delta_handles_wraps_saturation_and_resets() -> None:
    assert counter_delta(100, 150) == (50, False)
    assert counter_delta(2**32 - 10, 5) == (15, False)       # a 32-bit wrap
    assert counter_delta(2**32 - 1 - 5, 2**32 - 1) == (0, True)  # saturated legacy counter
    assert counter_delta(5_000, 20) == (20, False)            # reset


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write(root: Path, rel: str, value: int | str) -> None:
    (root / "class/infiniband" / rel).write_text(f"{value}\n")


@pytest.fixture
def rdma_tree(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(FIXTURES / "rdma/sys", root)
    return root


def test_rdma_rates_from_the_fixture_tree(rdma_tree: Path) -> None:
    clock = Clock()
    observer = RdmaObserver(RdmaSection(sysfs_root=str(rdma_tree),
                                        link_classes={"eth2": "fabric"}), clock)
    observer.start()
    assert observer.describe()["ports"] == ["mlx4_0/1", "mlx5_0/1", "mlx5_1/1"]
    port = "mlx5_0/ports/1"
    write(rdma_tree, f"{port}/counters/port_xmit_data", 1000 + 25_000_000)  # words
    write(rdma_tree, f"{port}/counters/port_xmit_packets", 100 + 10_000)
    write(rdma_tree, f"{port}/counters/port_rcv_packets", 200 + 5_000)
    write(rdma_tree, f"{port}/hw_counters/rp_cnp_handled", 300)
    write(rdma_tree, f"{port}/hw_counters/np_ecn_marked_roce_packets", 50)
    write(rdma_tree, f"{port}/hw_counters/roce_adp_retrans", 7)
    write(rdma_tree, f"{port}/hw_counters/local_ack_timeout_err", 3)
    clock.now += 1.0
    sample = observer.sample(0.0)
    mlx5 = next(p for p in sample.ports if p.device == "mlx5_0")
    assert mlx5.tx_bps == 25_000_000 * 32          # 4-byte words, in bits
    assert mlx5.tx_utilization == pytest.approx(0.008)
    assert mlx5.netdev == "eth2" and mlx5.link_class == "fabric" and mlx5.up
    assert mlx5.cnp_handled_per_s == 300 and mlx5.retransmits_per_s == 10
    assert mlx5.congestion_fraction == pytest.approx(300 / 10_000)
    assert mlx5.rate_gbps == 100.0 and mlx5.state == "ACTIVE"
    # Cumulative since start, in bytes; retransmissions and timeouts apart.
    assert mlx5.totals.tx_bytes == 25_000_000 * 4 and mlx5.totals.tx_packets == 10_000
    assert (mlx5.totals.cnp_handled, mlx5.totals.ecn_marked) == (300, 50)
    assert (mlx5.totals.retransmits, mlx5.totals.timeouts) == (7, 3)
    write(rdma_tree, f"{port}/hw_counters/rp_cnp_handled", 10)   # reset: counts from 0 again
    clock.now += 1.0
    again = next(p for p in observer.sample(0.0).ports if p.device == "mlx5_0")
    assert again.totals.cnp_handled == 310 and again.totals.tx_packets == 10_000


def test_rdma_counters_that_wrap_saturate_reset_or_vanish(rdma_tree: Path) -> None:
    clock = Clock()
    observer = RdmaObserver(RdmaSection(sysfs_root=str(rdma_tree)), clock)
    ib = "mlx4_0/ports/1/counters"
    write(rdma_tree, f"{ib}/port_xmit_data", 2**32 - 100)
    write(rdma_tree, f"{ib}/port_rcv_data", 500_000)
    observer.start()
    write(rdma_tree, f"{ib}/port_xmit_data", 900)            # wrapped
    write(rdma_tree, f"{ib}/port_rcv_data", 2**32 - 1)       # saturated
    write(rdma_tree, f"{ib}/port_xmit_packets", 40)          # reset (was 100)
    clock.now += 2.0
    sample = observer.sample(0.0)
    mlx4 = next(p for p in sample.ports if p.device == "mlx4_0")
    assert mlx4.tx_bps == (1000 * 32) / 2.0
    assert mlx4.rx_bps == 0.0 and "port_rcv_data" in mlx4.saturated
    assert mlx4.tx_pps == 20.0
    assert mlx4.cnp_handled_per_s == 0.0                     # no hw_counters at all
    write(rdma_tree, f"{ib}/port_rcv_data", "garbage")
    clock.now += 1.0
    observer.sample(0.0)
    shutil.rmtree(rdma_tree / "class/infiniband/mlx5_0")      # the device disappears
    clock.now += 1.0
    sample = observer.sample(0.0)
    assert sample.missing == ("mlx5_0/1",)
    assert [p.device for p in sample.ports] == ["mlx4_0", "mlx5_1"]


def test_no_rdma_devices_is_feature_absent(tmp_path: Path) -> None:
    with pytest.raises(FeatureAbsent):
        RdmaObserver(RdmaSection(sysfs_root=str(tmp_path))).start()
