"""Which interface a peer prefix is reached through, from the kernel's routing table
(netlink ``RTM_GETROUTE``), cached for ``ROUTE_TTL`` seconds: for attributing
retransmissions to a link.
"""

from __future__ import annotations

import ipaddress
from typing import Protocol

from agent.kernel.netlink import Netlink

ROUTE_TTL = 30.0


class Prefix(Protocol):
    """A peer's address prefix (as the eBPF datapath reports it); hashable."""

    @property
    def address(self) -> bytes: ...

    def __hash__(self) -> int: ...


class RouteCache:
    """Which interface a peer prefix is reached through (for retransmit attribution)."""

    def __init__(self) -> None:
        self._netlink: Netlink | None = None
        self._cache: dict[Prefix, tuple[int | None, float]] = {}

    def oif(self, prefix: Prefix, now: float) -> int | None:
        """The interface the route to ``prefix``'s address leaves by (None: no route)."""
        hit = self._cache.get(prefix)
        if hit is not None and now - hit[1] < ROUTE_TTL:
            return hit[0]
        oif = None
        try:
            if self._netlink is None:
                self._netlink = Netlink()
            address = str(ipaddress.ip_address(prefix.address))
            ipr = self._netlink.ipr
            routes = self._netlink.call(lambda: list(ipr.route("get", dst=address)))
            oif = routes[0].get_attr("RTA_OIF") if routes else None
        except Exception:  # unreachable prefix: unattributed
            oif = None
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[prefix] = (oif, now)
        return oif

    def close(self) -> None:
        if self._netlink is not None:
            self._netlink.close()
            self._netlink = None
