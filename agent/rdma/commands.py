"""The RDMA domain's operator command: ``rdma`` (ports' counters, congestion control)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from agent.rdma.types import RdmaSample
from harmonaize.opsocket import Command

if TYPE_CHECKING:
    from agent.rdma.service import RdmaCcService


class Shell(Protocol):
    """What the command reads of the daemon: the control shell."""

    rdma_cc: RdmaCcService | None


def commands(shell: Shell, latest: Callable[[], RdmaSample | None]) -> dict[str, Command]:
    """``latest``: the latest pass's RDMA sample (the daemon, the composition, hands it in)."""
    return {"rdma": Command(lambda args: rdma_view(shell, latest()),
                            "RDMA ports' counters; congestion control: values, originals, why")}


def rdma_view(shell: Shell, sample: RdmaSample | None) -> dict[str, Any]:
    ports = [{
        "name": port.name, "netdev": port.netdev, "state": port.state, "up": port.up,
        "rate_gbps": port.rate_gbps, "tx_bps": port.tx_bps, "rx_bps": port.rx_bps,
        "cnp_handled_per_s": port.cnp_handled_per_s, "cnp_sent_per_s": port.cnp_sent_per_s,
        "ecn_marked_per_s": port.ecn_marked_per_s,
        "out_of_sequence_per_s": port.out_of_sequence_per_s,
        "retransmits_per_s": port.retransmits_per_s,
        "totals": dataclasses.asdict(port.totals),
    } for port in (sample.ports if sample is not None else ())]
    cc = shell.rdma_cc.describe() if shell.rdma_cc is not None else {"enabled": False}
    return {"ports": ports, "missing": list(sample.missing) if sample else [], "cc": cc}
