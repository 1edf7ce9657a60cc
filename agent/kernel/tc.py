"""Attaching our cls_bpf filters to clsact hooks, and only ever removing our own.

An existing clsact qdisc is reused; one we add is left in place when other
filters still use it. Our filters are recognised by the program name prefix
(``hz_tc_``), which the kernel reports in filter dumps, so filters left behind
by a killed agent are found and removed at the next start.
"""

from __future__ import annotations

import errno
import logging
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from agent.kernel.netlink import Netlink

log = logging.getLogger(__name__)

OUR_PREFIX = "hz_tc_"
OUR_PRIO = 1
INGRESS = 0xFFFFFFF2  # ffff:fff2
EGRESS = 0xFFFFFFF3  # ffff:fff3
PARENTS = {"ingress": INGRESS, "egress": EGRESS}


@dataclass(frozen=True)
class Filter:
    ifindex: int
    parent: int
    handle: int
    info: int
    #: The BPF program's name; empty for filters of other kinds.
    name: str


class Tc:
    def __init__(self, netlink: Netlink | None = None) -> None:
        self._own = netlink is None
        self.netlink = netlink or Netlink()

    def close(self) -> None:
        if self._own:
            self.netlink.close()

    def _tc(self, *args: Any, **kwargs: Any) -> Any:
        return self.netlink.call(self.netlink.ipr.tc, *args, **kwargs)

    def ensure_clsact(self, ifindex: int) -> bool:
        """Add a clsact qdisc unless one is there; True if we added it."""
        try:
            self._tc("add", "clsact", ifindex)
        except NetlinkError as exc:
            if exc.code == errno.EEXIST:
                return False
            raise
        return True

    def filters(self, ifindex: int, parent: int) -> list[Filter]:
        found = []
        try:
            dump = self.netlink.call(
                lambda: list(self.netlink.ipr.get_filters(ifindex, parent=parent)))
        except NetlinkError as exc:
            if exc.code in (errno.EINVAL, errno.ENOENT, errno.ENODEV):
                return []  # no clsact here
            raise
        for msg in dump:
            if not msg["handle"]:
                continue  # the chain/priority header entries of a dump
            name = ""
            if msg.get_attr("TCA_KIND") == "bpf":
                options = msg.get_attr("TCA_OPTIONS")
                name = (options.get_attr("TCA_BPF_NAME") if options is not None else "") or ""
            found.append(Filter(ifindex, parent, msg["handle"], msg["info"], name))
        return found

    def ours(self, ifindex: int) -> list[Filter]:
        return [
            f
            for parent in (INGRESS, EGRESS)
            for f in self.filters(ifindex, parent)
            if f.name.startswith(OUR_PREFIX)
        ]

    def attach(self, ifindex: int, fd: int, name: str, direction: str) -> None:
        """Attach first in line (prio 1), so we count what later filters drop too."""
        kwargs = {"fd": fd, "name": name, "parent": PARENTS[direction], "classid": 1,
                  "direct_action": True}
        try:
            self._tc("add-filter", "bpf", ifindex, ":1", prio=OUR_PRIO, **kwargs)
        except NetlinkError as exc:
            if exc.code not in (errno.EINVAL, errno.EEXIST):
                raise
            log.info("prio %d is taken on ifindex %d: attaching after it", OUR_PRIO, ifindex)
            self._tc("add-filter", "bpf", ifindex, ":1", **kwargs)

    def remove(self, f: Filter) -> None:
        try:
            self._tc("del-filter", kind="bpf", index=f.ifindex, handle=f.handle,
                     parent=f.parent, info=f.info)
        except NetlinkError as exc:
            if exc.code not in (errno.ENOENT, errno.ENODEV, errno.EINVAL):
                raise

    def remove_ours(self, ifindex: int) -> int:
        removed = self.ours(ifindex)
        for f in removed:
            self.remove(f)
        return len(removed)

    def remove_stale(self) -> dict[str, int]:
        """Remove our filters from every interface (a killed agent's leftovers)."""
        removed: dict[str, int] = {}
        links = self.netlink.call(
            lambda: [(m["index"], m.get_attr("IFLA_IFNAME")) for m in self.netlink.ipr.get_links()])
        for ifindex, name in links:
            count = self.remove_ours(ifindex)
            if count:
                removed[name] = count
        return removed

    def drop_clsact_if_unused(self, ifindex: int) -> bool:
        """Delete a clsact we added, but only if no filter (ours or anyone's) remains."""
        if self.filters(ifindex, INGRESS) or self.filters(ifindex, EGRESS):
            return False
        try:
            self._tc("del", "clsact", ifindex)
        except NetlinkError:
            return False
        return True


def describe(f: Filter) -> dict[str, Any]:
    direction = "ingress" if f.parent == INGRESS else "egress"
    return {"ifindex": f.ifindex, "direction": direction, "name": f.name, "handle": f.handle}
