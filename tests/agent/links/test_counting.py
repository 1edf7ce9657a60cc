"""Counts that mean what they say, without root: the egress ledger and the qdisc dump parser."""

from __future__ import annotations

import struct

import pytest

from agent.kernel.qdisc import (
    NLMSG_DONE,
    RTM_NEWQDISC,
    TC_H_CLSACT,
    TC_H_ROOT,
    InterfaceQdiscs,
    QdiscCounters,
    parse_dump,
)
from agent.kernel.sysfs import DevCounters, NetDevice
from agent.links.counting import Accumulator, EgressLedger, LinkAccount, delta32
from agent.links.datapath import dscp_map, dscp_words, programs
from agent.links.observer import LinksObserver
from agent.links.settings import LinksSection
from tests.conftest import ROOT

pytestmark = pytest.mark.links


def qdisc(kind: str = "tbf", sent: int = 0, packets: int = 0, drops: int = 0,
          handle: int = 0x80010000) -> QdiscCounters:
    return QdiscCounters(kind, handle, sent, packets, drops)


def test_transmit_is_what_the_root_qdisc_passed_on() -> None:
    ledger = EgressLedger()
    ledger.update(1_000, 10, qdisc(sent=5_000, packets=50))      # baseline
    # 100 packets of 1000 bytes offered, the qdisc sent 40 of them, dropped the rest.
    ledger.update(101_000, 110, qdisc(sent=45_000, packets=90, drops=60))
    assert (ledger.held_bytes, ledger.held_packets) == (60_000, 60)
    assert ledger.byte_share == pytest.approx(0.4) and ledger.packet_share == pytest.approx(0.4)
    # Nothing more offered; the queue drains 5 more packets: they left after all.
    ledger.update(101_000, 110, qdisc(sent=50_000, packets=95, drops=60))
    assert (ledger.held_bytes, ledger.held_packets) == (55_000, 55)
    assert ledger.byte_share == 1.0


def test_a_new_root_qdisc_keeps_what_was_held_and_starts_a_new_baseline() -> None:
    ledger = EgressLedger()
    ledger.update(0, 0, qdisc(sent=0))
    ledger.update(10_000, 10, qdisc(sent=4_000, packets=4))
    assert ledger.held_bytes == 6_000
    # Replaced by another qdisc (other handle): its counters start from zero.
    ledger.update(12_000, 12, qdisc("htb", sent=100, packets=1, handle=0x485A0000))
    assert ledger.held_bytes == 6_000
    ledger.update(22_000, 22, qdisc("htb", sent=10_100, packets=11, handle=0x485A0000))
    assert ledger.held_bytes == 6_000                         # everything new passed
    # The same handle with counters that went backwards is a new qdisc too.
    ledger.update(23_000, 23, qdisc("htb", sent=0, packets=0, handle=0x485A0000))
    ledger.update(24_000, 24, qdisc("htb", sent=500, packets=1, handle=0x485A0000))
    assert ledger.held_bytes == 6_500


def test_noqueue_passes_everything_on() -> None:
    ledger = EgressLedger()
    for offered in (0, 1_000, 50_000):
        ledger.update(offered, offered // 100, qdisc("noqueue"))
        ledger.update(offered, offered // 100, None)
    assert (ledger.held_bytes, ledger.held_packets, ledger.byte_share) == (0, 0, 1.0)


def test_32_bit_counters_wrap_forwards() -> None:
    assert delta32(5, 2**32 - 5) == 10
    acc = Accumulator()
    for value in (2**32 - 10, 2**32 - 1, 3):
        acc.add(value, width32=True)
    assert acc.total == 13
    reset = Accumulator()
    for value in (100, 150, 20):  # a 64-bit counter that went back was reset
        reset.add(value)
    assert reset.total == 70


def test_a_link_account_counts_drops_by_where_they_happened() -> None:
    account = LinkAccount()
    dev = DevCounters(0, 0, 0, 1, 0, 0, 0, 2)
    account.fold(0.0, dev, InterfaceQdiscs(qdisc(drops=10), qdisc("clsact", drops=3)))
    dev = DevCounters(0, 0, 1, 4, 0, 0, 0, 2)
    account.fold(2.0, dev, InterfaceQdiscs(qdisc(drops=70), qdisc("clsact", drops=5)))
    assert account.rates() == (1.5, 0.5, 30.0, 1.0)
    # The NIC read more often than the qdiscs (proc mode): each over its own span.
    account.fold(2.5, DevCounters(0, 0, 1, 5, 0, 0, 0, 2), None)
    assert account.rates() == (2.0, 0.0, 30.0, 1.0)
    # A new root qdisc: its drop counter starts again, the link's total does not.
    account.fold(3.0, None, InterfaceQdiscs(qdisc("htb", drops=4, handle=0x485A0000), None))
    account.fold(4.0, None, InterfaceQdiscs(qdisc("htb", drops=9, handle=0x485A0000), None))
    assert (account.qdisc_drops.total, account.tc_drops.total) == (65, 2)
    assert account.rates() == (2.0, 0.0, 5.0, 0.0)


def nlmsg(kind: int, ifindex: int = 0, parent: int = 0, attrs: bytes = b"") -> bytes:
    body = struct.pack("=BxxxiIII", 0, ifindex, 0x10000, parent, 0) + attrs
    return struct.pack("=IHHII", 16 + len(body), kind, 2, 1, 0) + body


def rtattr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def stats(sent: int, packets: int, drops: int, pkt64: int | None = None) -> bytes:
    inner = (rtattr(1, struct.pack("=QIxxxx", sent, packets))
             + rtattr(3, struct.pack("=IIIII", 2, 3000, drops, 0, 7)))
    if pkt64 is not None:
        inner += rtattr(8, struct.pack("=Q", pkt64))
    return rtattr(0x8000 | 7, inner)  # TCA_STATS2, nested


def test_the_dump_parser_takes_the_watched_roots_and_clsacts() -> None:
    chunk = (nlmsg(RTM_NEWQDISC, 2, TC_H_ROOT, rtattr(1, b"tbf\0") + stats(500, 5, 9))
             + nlmsg(RTM_NEWQDISC, 2, TC_H_CLSACT, rtattr(1, b"clsact\0") + stats(0, 0, 4))
             + nlmsg(RTM_NEWQDISC, 2, 0x80010001, rtattr(1, b"pfifo\0") + stats(1, 1, 1))
             + nlmsg(RTM_NEWQDISC, 3, TC_H_ROOT, rtattr(1, b"mq\0") + stats(8, 1, 0, 2**40))
             + nlmsg(RTM_NEWQDISC, 9, TC_H_ROOT, rtattr(1, b"noqueue\0") + stats(0, 0, 0)))
    found: dict[int, dict[int, QdiscCounters]] = {}
    assert not parse_dump(chunk, {2, 3}, found)
    assert parse_dump(nlmsg(NLMSG_DONE), {2, 3}, found)
    root = found[2][TC_H_ROOT]
    assert (root.kind, root.bytes, root.packets, root.drops, root.backlog_bytes) == (
        "tbf", 500, 5, 9, 3000)
    assert found[2][TC_H_CLSACT].drops == 4
    assert found[3][TC_H_ROOT].packets == 2**40        # the 64-bit packet count wins
    assert set(found) == {2, 3} and set(found[2]) == {TC_H_ROOT, TC_H_CLSACT}


def test_the_dump_parser_survives_truncated_and_garbage_messages() -> None:
    good = nlmsg(RTM_NEWQDISC, 2, TC_H_ROOT, rtattr(1, b"tbf\0") + stats(1, 1, 1))
    found: dict[int, dict[int, QdiscCounters]] = {}
    assert parse_dump(good[:-3], {2}, found) and found == {}
    bad_attr = nlmsg(RTM_NEWQDISC, 2, TC_H_ROOT, struct.pack("=HH", 200, 1) + b"xxxx")
    assert not parse_dump(bad_attr, {2}, found)
    assert found[2][TC_H_ROOT].kind == "" and found[2][TC_H_ROOT].bytes == 0


class FakeDatapath:
    """The part of LinkDatapath the drop reasons come from."""

    has_drops = True

    def __init__(self) -> None:
        self.drop_reasons = {2: "NOT_SPECIFIED", 5: "TC_INGRESS"}
        self.counts: dict[int, int] = {}

    def read_drops(self) -> dict[int, int]:
        return dict(self.counts)


def test_kernel_drops_by_reason_are_the_same_for_every_reader() -> None:
    observer = LinksObserver(LinksSection())
    datapath = FakeDatapath()
    observer.datapath = datapath  # type: ignore[assignment]
    assert observer.drops_by_reason() == {}
    observer._read_drops(0.0)
    datapath.counts = {5: 100, 2: 4}
    observer._read_drops(5.0)
    first = observer.drops_by_reason()
    datapath.counts = {5: 900, 2: 4}            # more drops, not read yet
    # A second reader (or the same one again) sees the same moment: reading resets nothing.
    assert observer.drops_by_reason() == first == {
        "NOT_SPECIFIED": {"total": 4, "per_s": 0.8}, "TC_INGRESS": {"total": 100, "per_s": 20.0}}
    observer._read_drops(10.0)
    assert observer.drops_by_reason()["TC_INGRESS"] == {"total": 900, "per_s": 160.0}
    assert observer.drops_by_reason()["NOT_SPECIFIED"] == {"total": 4, "per_s": 0.0}


def test_the_dscp_table_and_the_programs_compiled_in() -> None:
    classes = dscp_map({5: [46, 34], 1: [8]})
    words = dscp_words(classes)
    # What the C does: (word[d >> 4] >> ((d & 15) * 4)) & 7.
    decoded = [(words[d >> 4] >> ((d & 15) * 4)) & 7 for d in range(64)]
    assert decoded == classes and decoded[46] == 5 and decoded[8] == 1 and decoded[63] == 7
    # The default words bpf/link_counters.c carries are the precedence, DSCP >> 3.
    source = (ROOT / "bpf" / "link_counters.c").read_text()
    for i, word in enumerate(dscp_words(dscp_map())):
        assert f"#define HZ_DSCP_W{i} {word:#018x}ULL" in source.replace("0X", "0x")
    eth, raw = NetDevice("eth0", 7, 1, True, False, "up"), NetDevice("tun0", 9, 65534, False,
                                                                      False, "up")
    text, names = programs([eth, raw])
    assert names == {7: ("hz_tc_i0", "hz_tc_e0"), 9: ("hz_tc_i1", "hz_tc_e1")}
    assert "int hz_tc_e0(struct __sk_buff *skb) { return hz_count(skb, 1, 0, 14); }" in text
    assert "int hz_tc_i1(struct __sk_buff *skb) { return hz_count(skb, 0, 1, 0); }" in text
