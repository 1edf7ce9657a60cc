"""What ``harmonctl links`` shows of each link: rates, totals and traffic classes.

Units (docs/operator-guide.md lists every field): rates in bits or packets per
second over the last sampling interval, bytes as on the wire including the L2
header (a GSO packet as its segments with their headers), totals cumulative
since the observer started on the link.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agent.links.types import LinkSample


def links_table(sample: LinkSample | None) -> list[dict[str, Any]]:
    """Rows for ``harmonctl links``."""
    if sample is None:
        return []
    return [
        {
            "name": link.name,
            "class": link.link_class,
            "up": link.up,
            "speed_mbps": link.speed_mbps,
            "rx_bps": round(link.rx_bps),
            "tx_bps": round(link.tx_bps),
            "rx_pps": round(link.rx_pps),
            "tx_pps": round(link.tx_pps),
            "rx_utilization": link.rx_utilization,
            "tx_utilization": link.tx_utilization,
            "ect_fraction": link.ect_fraction,
            "ce_fraction": link.ce_fraction,
            "retransmits_per_s": link.retransmits_per_s,
            "retransmit_fraction": link.retransmit_fraction,
            "drops_per_s": link.all_drops_per_s,
            "drops_per_s_by_source": {"nic": link.drops_per_s, "qdisc": link.qdisc_drops_per_s,
                                      "tc": link.tc_drops_per_s},
            "errors_per_s": link.errors_per_s,
            "totals": dataclasses.asdict(link.totals),
            "traffic_classes": {
                str(c.cls): {"rx_bps": round(c.rx_bps), "tx_bps": round(c.tx_bps),
                             "rx_bytes": c.rx_bytes_total, "tx_bytes": c.tx_bytes_total}
                for c in link.classes
            },
        }
        for link in sample.links
    ]
