"""Loss on a lab host's link, from a small eBPF tc program of the tests' own.

This kernel has no netem (nor the gact action), so tests and benchmarks that
need packets lost, or a host cut off in one direction, attach
``bpf/drop.c`` at a host's clsact ingress or egress and set the share of
packets it drops (per mille; 1000 cuts the direction). The filter goes with
the namespace when the lab is torn down.
"""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path

from testbed.netns import Lab

SOURCE = Path(__file__).resolve().parent / "bpf" / "drop.c"


class Dropper:
    def __init__(self, lab: Lab, host: str, direction: str = "egress", permille: int = 0,
                 ifname: str = "eth0") -> None:
        # bcc and pyroute2 are the agent's own dependencies; imported here so the
        # testbed's other modules load without them.
        from bcc import BPF  # noqa: PLC0415
        from pyroute2 import NetNS  # noqa: PLC0415
        from pyroute2.netlink.exceptions import NetlinkError  # noqa: PLC0415

        self.bpf = BPF(src_file=str(SOURCE).encode())
        fn = self.bpf.load_func(b"test_drop", BPF.SCHED_CLS)
        self.set(permille)
        ns = NetNS(lab.ns(host))
        try:
            index = ns.link_lookup(ifname=ifname)[0]
            with contextlib.suppress(NetlinkError):  # the agent's clsact may be there
                ns.tc("add", "clsact", index)
            parent = "ffff:fff3" if direction == "egress" else "ffff:fff2"
            # Behind the agent's own filter (prio 100 comes after it).
            ns.tc("add-filter", "bpf", index, ":1", fd=fn.fd, name=fn.name, parent=parent,
                  classid=1, direct_action=True, prio=100)
        finally:
            ns.close()

    def set(self, permille: int) -> None:
        self.bpf[b"test_drop_permille"][ctypes.c_int(0)] = ctypes.c_uint32(permille)
