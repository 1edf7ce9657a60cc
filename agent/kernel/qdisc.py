"""Each watched interface's root and clsact qdisc counters, from one netlink dump.

The eBPF egress counter runs at clsact egress, before the root qdisc: what the
qdisc then drops or still holds never left the interface. The root qdisc's own
counters say what it passed on (``tc -s qdisc``: "Sent" bytes and packets,
"dropped", the backlog), in the units our counter uses (``qdisc_pkt_len``: a
GSO packet counts as its segments, each with its headers), and the clsact
qdisc's "dropped" counts what tc filters shot on either hook.

One ``RTM_GETQDISC`` dump per read. A dump, not a get per interface: a get is
answered as a notification to every ``tc monitor`` on the host. The messages
are parsed here with ``struct`` and only the watched roots and clsacts are
looked into: a host with multi-queue NICs has a qdisc per queue, and decoding
hundreds of them through pyroute2's message classes (tens of microseconds
each) every second would cost more than the rest of a sampling pass. Layouts
are the UAPI ones (``linux/rtnetlink.h``, ``linux/pkt_sched.h``,
``linux/gen_stats.h``).
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

RTM_NEWQDISC = 36
RTM_GETQDISC = 38
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
TC_H_ROOT = 0xFFFFFFFF
TC_H_CLSACT = 0xFFFFFFF1  # the parent the kernel reports for clsact (and ingress)
TCA_KIND = 1
TCA_STATS2 = 7
TCA_STATS_BASIC = 1
TCA_STATS_QUEUE = 3
TCA_STATS_PKT64 = 8
NLA_TYPE_MASK = 0x3FFF

_NLMSGHDR = struct.Struct("=IHHII")
_TCMSG = struct.Struct("=BxxxiIII")
_RTATTR = struct.Struct("=HH")
_BASIC = struct.Struct("=QI")
_QUEUE = struct.Struct("=IIIII")
_U64 = struct.Struct("=Q")

#: Root qdiscs that pass packets on without counting them (nothing queues, nothing
#: is dropped there).
PASS_THROUGH = frozenset({"noqueue"})


@dataclass(frozen=True)
class QdiscCounters:
    kind: str
    handle: int
    bytes: int
    #: 32-bit in the basic stats; 64-bit where the kernel sends TCA_STATS_PKT64.
    packets: int
    drops: int
    backlog_bytes: int = 0
    backlog_packets: int = 0


@dataclass(frozen=True)
class InterfaceQdiscs:
    root: QdiscCounters | None
    clsact: QdiscCounters | None


def _attrs(data: bytes, start: int, end: int) -> Iterable[tuple[int, int, int]]:
    """(type, payload start, payload end) of each rtattr in data[start:end]."""
    offset = start
    while offset + _RTATTR.size <= end:
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size or offset + length > end:
            return
        yield kind & NLA_TYPE_MASK, offset + _RTATTR.size, offset + length
        offset += (length + 3) & ~3


def parse_qdisc(data: bytes, start: int, end: int, handle: int) -> QdiscCounters:
    """One qdisc message's attributes (after its tcmsg) into counters."""
    kind = ""
    sent_bytes = packets = drops = backlog = qlen = 0
    packets64: int | None = None
    for attr, lo, hi in _attrs(data, start, end):
        if attr == TCA_KIND:
            kind = data[lo:hi].split(b"\0", 1)[0].decode("ascii", "replace")
        elif attr == TCA_STATS2:
            for sub, slo, shi in _attrs(data, lo, hi):
                if sub == TCA_STATS_BASIC and shi - slo >= _BASIC.size:
                    sent_bytes, packets = _BASIC.unpack_from(data, slo)
                elif sub == TCA_STATS_QUEUE and shi - slo >= _QUEUE.size:
                    qlen, backlog, drops, _, _ = _QUEUE.unpack_from(data, slo)
                elif sub == TCA_STATS_PKT64 and shi - slo >= _U64.size:
                    (packets64,) = _U64.unpack_from(data, slo)
    return QdiscCounters(kind, handle, sent_bytes,
                         packets if packets64 is None else packets64, drops, backlog, qlen)


def parse_dump(data: bytes, wanted: frozenset[int] | set[int],
               into: dict[int, dict[int, QdiscCounters]]) -> bool:
    """Add the root and clsact qdiscs of ``wanted`` interfaces in one chunk of a
    dump to ``into`` (ifindex -> parent -> counters); True once the dump is done."""
    offset = 0
    while offset + _NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = _NLMSGHDR.unpack_from(data, offset)
        if length < _NLMSGHDR.size or offset + length > len(data):
            return True  # truncated: nothing more can be trusted
        body = offset + _NLMSGHDR.size
        if kind in (NLMSG_DONE, NLMSG_ERROR):
            return True
        if kind == RTM_NEWQDISC and body + _TCMSG.size <= offset + length:
            _, ifindex, handle, parent, _ = _TCMSG.unpack_from(data, body)
            if ifindex in wanted and parent in (TC_H_ROOT, TC_H_CLSACT):
                into.setdefault(ifindex, {})[parent] = parse_qdisc(
                    data, body + _TCMSG.size, offset + length, handle)
        offset += (length + 3) & ~3
    return False


class QdiscReader:
    """Reads the counters over a netlink socket of the caller's network namespace."""

    def __init__(self, timeout: float = 1.0) -> None:
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._seq = 0

    def _socket(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC,
                                 socket.NETLINK_ROUTE)
            sock.settimeout(self._timeout)
            sock.bind((0, 0))
            self._sock = sock
        return self._sock

    def read(self, ifindexes: Iterable[int]) -> dict[int, InterfaceQdiscs]:
        """Root and clsact counters of each interface; an interface without a root
        qdisc (or gone) maps to None fields. Raises OSError if netlink fails."""
        wanted = set(ifindexes)
        found: dict[int, dict[int, QdiscCounters]] = {}
        sock = self._socket()
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        request = _TCMSG.pack(0, 0, 0, 0, 0)
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(request), RTM_GETQDISC,
                                 NLM_F_REQUEST | NLM_F_DUMP, self._seq, 0) + request)
        try:
            while not parse_dump(sock.recv(1 << 16), wanted, found):
                pass
        except OSError:
            self.close()  # a half-read dump would poison the next one
            raise
        return {ifindex: InterfaceQdiscs(found.get(ifindex, {}).get(TC_H_ROOT),
                                         found.get(ifindex, {}).get(TC_H_CLSACT))
                for ifindex in wanted}

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()
            self._sock = None


def read_once(ifindexes: Iterable[int]) -> dict[int, InterfaceQdiscs]:
    """For tools and tests: one read with a socket of its own."""
    reader = QdiscReader()
    try:
        return reader.read(ifindexes)
    finally:
        reader.close()
