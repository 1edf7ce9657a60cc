"""Traffic priority on kernel paths: collectives ahead of bulk, bulk keeps its floor.

On each data link that carries a job with declared bulk traffic, the agent
installs an HTB root qdisc of its own (handle ``485a:``, "HZ", by which a
restarted agent recognises what a killed one left) shaped to the link's
speed:

* ``485a:1``   root class, rate = ceil = link;
* ``485a:10``  the default class: collectives and everything not declared as
  bulk; rate = link minus the bulk floors, ceil = link, priority 0;
* ``485a:1xx`` one class per job with bulk traffic; rate = the job's floor,
  ceil = link, priority 1.

HTB first serves every class up to its rate, then lends what is left to the
classes that want more, lower priority value first. So on a congested link
the collectives get everything but the floors and first call on the rest,
while bulk always keeps its floor and may use the whole link when the
collectives leave it idle. ``bpf/bulk_classify.c`` at clsact egress (which
runs before the root qdisc) sets ``skb->priority`` to a job's class id for
its bulk packets (by DSCP or remote TCP port); HTB takes a priority that
names one of its leaf classes as the class.

Only our own objects are ever touched: a root qdisc someone else installed
(anything but the kernel's default, handle ``0:``) is reported and left
alone, and our filters are found by the program name prefix ``hz_bulk_``.
RDMA traffic never passes the qdisc (``research/nccl.md`` §5): this orders
the kernel paths only (NCCL's socket transport, checkpoints, data loading).

The plan (class ids, rates, which job claims which port or DSCP value) is
:mod:`agent.tuning.htbplan`'s; this module makes the kernel agree with it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2.netlink.exceptions import NetlinkError

from agent.kernel import bpfload
from agent.kernel.bpfload import Loaded
from agent.kernel.bpfprobe import BpfUnavailable, default_bpf_dir, headers_present
from agent.kernel.netlink import Netlink
from agent.kernel.tc import EGRESS, Tc
from agent.tuning.htbplan import (
    BULK_MINOR_BASE,
    DEFAULT_CLASS,
    DEFAULT_MINOR,
    DSCP_FLAG,
    FILTER_PREFIX,
    FILTER_PRIO,
    IF_TABLE,
    LEAF_MAJOR_BASE,
    MAJOR,
    MAX_BULK_CLASSES,
    MIN_RATE_KBIT,
    PROGRAM,
    ROOT,
    ROOT_CLASS,
    TC_H_ROOT,
    BulkJob,
    ClassPlan,
    LinkPlan,
    Plan,
    assign_minors,
    fair_floors,
    handle_str,
    plan,
)

log = logging.getLogger(__name__)

#: Each class may burst about this long at its rate (HTB needs a burst of at
#: least rate x timer granularity to reach its rate at all).
BURST_SECONDS = 0.001
MTU_BURST = 2 * 1600


@dataclass
class _Link:
    ifindex: int
    created_clsact: bool = False
    classes: dict[int, ClassPlan] = field(default_factory=dict)


class HtbShaper:
    """Applies :class:`Plan` s with pyroute2, and removes only what is ours."""

    def __init__(self, bpf_dir: Path | None = None, *, netlink: Netlink | None = None) -> None:
        self.bpf_dir = bpf_dir or default_bpf_dir()
        self._netlink = netlink
        self._tc: Tc | None = None
        self._loaded: Loaded | None = None
        self._links: dict[str, _Link] = {}
        self._flows: dict[tuple[int, int], int] = {}
        self._leaf_ok = True
        self._plan: Plan | None = None
        #: Per link: "shaped", or why not.
        self.status: dict[str, str] = {}
        self.error = ""

    # --- netlink plumbing --------------------------------------------------------------

    @property
    def tc(self) -> Tc:
        if self._tc is None:
            self._tc = Tc(self._netlink)
        return self._tc

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        return self.tc.netlink.call(self.tc.netlink.ipr.tc, *args, **kwargs)

    def _ifindex(self, name: str) -> int | None:
        ipr = self.tc.netlink.ipr
        found = self.tc.netlink.call(lambda: list(ipr.link_lookup(ifname=name)))
        return found[0] if found else None

    def _root(self, ifindex: int) -> tuple[str, int] | None:
        ipr = self.tc.netlink.ipr
        for msg in self.tc.netlink.call(lambda: list(ipr.get_qdiscs(index=ifindex))):
            if msg["parent"] == TC_H_ROOT and msg["index"] == ifindex:
                return msg.get_attr("TCA_KIND") or "?", msg["handle"]
        return None

    # --- start-up and teardown ---------------------------------------------------------

    def remove_stale(self) -> dict[str, list[str]]:
        """Remove what a killed agent left on any interface of this namespace."""
        removed: dict[str, list[str]] = {}
        ipr = self.tc.netlink.ipr
        links = self.tc.netlink.call(
            lambda: [(m["index"], m.get_attr("IFLA_IFNAME")) for m in ipr.get_links()])
        for ifindex, name in links:
            for f in self.tc.filters(ifindex, EGRESS):
                if f.name.startswith(FILTER_PREFIX):
                    self.tc.remove(f)
                    removed.setdefault(name, []).append(f"filter {f.name}")
            root = self._root(ifindex)
            if root is not None and root[1] == ROOT:
                self._delete_root(ifindex)
                removed.setdefault(name, []).append(f"qdisc {root[0]} {handle_str(ROOT)}")
        if removed:
            log.warning("removed traffic classes left by a previous agent: %s", removed)
        return removed

    def close(self) -> None:
        """Remove everything ours (agent stopping)."""
        for name in list(self._links):
            self._unshape(name)
        if self._loaded is not None:
            self._loaded.close()
            self._loaded = None
        if self._tc is not None:
            self._tc.close()
            self._tc = None
        self._plan = None

    # --- applying a plan ---------------------------------------------------------------

    @property
    def planned(self) -> Plan | None:
        """The plan applied last (who holds which port and DSCP value)."""
        return self._plan

    def apply(self, new: Plan, l2_lens: Mapping[str, int] | None = None) -> None:
        """Make the kernel match ``new`` (a no-op when it already does)."""
        if new == self._plan:
            return
        said = set(self._plan.notes) if self._plan else set()
        for note in new.notes:
            if note not in said:  # one line each, when it first holds
                log.warning("traffic classes: %s", note)
        wanted = {link.name: link for link in new.links}
        for name in list(self._links):
            if name not in wanted:
                self._unshape(name)
        self.status = {n: s for n, s in self.status.items() if n in wanted}
        if wanted:
            try:
                self._load()
            except BpfUnavailable as exc:
                self.error = f"bulk classifier unavailable: {exc}"
                for name in wanted:
                    self.status[name] = f"not shaped: {self.error}"
                self._plan = new
                return
        for name, link in wanted.items():
            try:
                self._shape(link, (l2_lens or {}).get(name, 14))
            except (NetlinkError, OSError) as exc:
                self.status[name] = f"failed: {exc}"
                log.warning("traffic classes on %s: %s", name, exc)
        if self._loaded is not None:
            self._write_maps(new)
        self._plan = new

    def _load(self) -> None:
        if self._loaded is not None:
            return
        if not headers_present():
            raise BpfUnavailable("no kernel headers for bcc")
        source = self.bpf_dir / "bulk_classify.c"
        if not source.is_file():
            raise BpfUnavailable(f"BPF source {source} not found")
        try:
            self._loaded = bpfload.load([bpfload.Request(str(source), [],
                                                         {PROGRAM: "sched_cls"})])
        except bpfload.LoadError as exc:
            raise BpfUnavailable(str(exc)) from None
        self.error = ""

    def _shape(self, link: LinkPlan, l2_len: int) -> None:
        state = self._links.get(link.name)
        ifindex = self._ifindex(link.name)
        if ifindex is None:
            self.status[link.name] = "not shaped: interface absent"
            self._links.pop(link.name, None)
            return
        if state is None or state.ifindex != ifindex:
            root = self._root(ifindex)
            if root is not None and root[1] not in (0, ROOT):
                self.status[link.name] = (f"not shaped: root qdisc {root[0]} "
                                          f"{handle_str(root[1])} belongs to someone else")
                return
            if root is None or root[1] != ROOT:
                self._call("add", "htb", ifindex, ROOT, default=DEFAULT_MINOR)
            state = self._links[link.name] = _Link(ifindex)
        wanted = {c.classid: c for c in link.classes}
        # Parents before children; removed classes first, so their rates free up.
        for classid in sorted(set(state.classes) - set(wanted), reverse=True):
            with contextlib.suppress(NetlinkError):
                self._call("del-class", index=ifindex, handle=classid, parent=ROOT_CLASS)
            del state.classes[classid]
        for cls in sorted(wanted.values(), key=lambda c: (c.classid != ROOT_CLASS, c.classid)):
            if state.classes.get(cls.classid) == cls:
                continue
            self._call("replace-class", "htb", ifindex, cls.classid,
                       parent=ROOT if cls.classid == ROOT_CLASS else ROOT_CLASS,
                       rate=f"{cls.rate_kbit}kbit", ceil=f"{cls.ceil_kbit}kbit", prio=cls.prio,
                       burst=_burst(cls.rate_kbit), cburst=_burst(cls.ceil_kbit))
            if cls.classid != ROOT_CLASS and cls.classid not in state.classes:
                self._leaf(ifindex, cls.classid)
            state.classes[cls.classid] = cls
        self._attach(state, l2_len)
        self.status[link.name] = "shaped" + (" (floors scaled down)" if link.scaled else "")

    def _leaf(self, ifindex: int, classid: int) -> None:
        """fq_codel under a class, where the kernel has it: short queues per flow, so
        a collective's packets do not wait behind a long one (else HTB's pfifo)."""
        if not self._leaf_ok:
            return
        handle = (LEAF_MAJOR_BASE + (classid & 0xFFFF)) << 16
        try:
            self._call("add", "fq_codel", ifindex, handle, parent=classid)
        except NetlinkError as exc:
            if exc.code == errno.ENOENT:
                self._leaf_ok = False
                log.info("fq_codel is not available: HTB classes keep their pfifo")
            elif exc.code != errno.EEXIST:
                raise

    def _attach(self, state: _Link, l2_len: int) -> None:
        assert self._loaded is not None
        ifs = self._loaded.maps["hz_bulk_ifs"]
        ifs.update(struct.pack("<I", state.ifindex % IF_TABLE),
                   struct.pack("<II", state.ifindex, l2_len))
        if any(f.name.startswith(FILTER_PREFIX) for f in self.tc.filters(state.ifindex, EGRESS)):
            return
        if self.tc.ensure_clsact(state.ifindex):
            state.created_clsact = True
        kwargs = {"fd": self._loaded.programs[PROGRAM], "name": PROGRAM, "parent": EGRESS,
                  "classid": 1, "direct_action": True}
        try:
            self._call("add-filter", "bpf", state.ifindex, ":1", prio=FILTER_PRIO, **kwargs)
        except NetlinkError as exc:
            if exc.code not in (errno.EINVAL, errno.EEXIST):
                raise
            self._call("add-filter", "bpf", state.ifindex, ":1", **kwargs)  # prio taken

    def _write_maps(self, new: Plan) -> None:
        assert self._loaded is not None
        flows = self._loaded.maps["hz_bulk_flows"]
        wanted = {(uid, what): c for uid, what, c in new.flows}
        for key in set(self._flows) - set(wanted):
            flows.delete(struct.pack("<II", *key))
        for key, classid in wanted.items():
            if self._flows.get(key) != classid:
                flows.update(struct.pack("<II", *key), struct.pack("<I", classid))
        self._flows = wanted

    def _delete_root(self, ifindex: int) -> None:
        with contextlib.suppress(NetlinkError):
            self._call("del", index=ifindex, handle=ROOT, parent=TC_H_ROOT)

    def _unshape(self, name: str) -> None:
        state = self._links.pop(name, None)
        self.status.pop(name, None)
        if state is None:
            return
        try:
            for f in self.tc.filters(state.ifindex, EGRESS):
                if f.name.startswith(FILTER_PREFIX):
                    self.tc.remove(f)
            root = self._root(state.ifindex)
            if root is not None and root[1] == ROOT:
                self._delete_root(state.ifindex)  # the kernel puts its default back
            if state.created_clsact:
                self.tc.drop_clsact_if_unused(state.ifindex)
            if self._loaded is not None:
                self._loaded.maps["hz_bulk_ifs"].update(
                    struct.pack("<I", state.ifindex % IF_TABLE), struct.pack("<II", 0, 0))
        except (NetlinkError, OSError) as exc:  # the interface may be gone already
            log.debug("removing traffic classes from %s: %s", name, exc)

    def marked_packets(self) -> int:
        """Packets the classifier put into bulk classes so far."""
        if self._loaded is None:
            return 0
        counter = self._loaded.maps["hz_bulk_marked"]
        raw = counter.lookup(struct.pack("<I", 0))
        return counter.sum_percpu_u64(raw) if raw else 0

    def describe(self) -> dict[str, Any]:
        return {
            "links": dict(sorted(self.status.items())),
            "classes": {name: [{"class": handle_str(c.classid), "rate_kbit": c.rate_kbit,
                                "ceil_kbit": c.ceil_kbit, "prio": c.prio, "for": c.label}
                               for c in sorted(state.classes.values(), key=lambda c: c.classid)]
                        for name, state in sorted(self._links.items())},
            "bulk_packets": self.marked_packets(),
            "notes": list(self._plan.notes) if self._plan else [],
            "error": self.error,
        }


def _burst(rate_kbit: int) -> int:
    return max(MTU_BURST, int(rate_kbit * 1000 / 8 * BURST_SECONDS))


__all__ = ["BULK_MINOR_BASE", "DEFAULT_CLASS", "DEFAULT_MINOR", "DSCP_FLAG", "FILTER_PREFIX",
           "FILTER_PRIO", "IF_TABLE", "LEAF_MAJOR_BASE", "MAJOR", "MAX_BULK_CLASSES",
           "MIN_RATE_KBIT", "PROGRAM", "ROOT", "ROOT_CLASS", "TC_H_ROOT", "BulkJob",
           "ClassPlan", "HtbShaper", "LinkPlan", "Plan", "assign_minors", "fair_floors",
           "handle_str", "plan"]
