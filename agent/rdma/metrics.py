"""The RDMA domain's metrics: port counters, and congestion control's settings and changes.

Labels as node_exporter's InfiniBand collector has them (``device``, ``port``), a
``direction``, and for congestion control the configured ``device`` and the
``setting`` (a DCQCN parameter's name or ``rp_enable/<priority>``).
"""

from __future__ import annotations

from agent.rdma.service import RdmaCcService
from agent.rdma.types import RdmaSample
from harmonaize.metrics import Family, counter, gauge

#: Metric name (after ``rdma_``) -> RdmaTotals field and help.
PORT_COUNTERS = {
    "cnp_sent_total": ("cnp_sent", "CNPs sent as a receiver that saw ECN marks."),
    "cnp_handled_total": ("cnp_handled", "CNPs acted on as a sender (rate cuts)."),
    "cnp_ignored_total": ("cnp_ignored", "CNPs received while the reaction point was off."),
    "ecn_marked_packets_total": ("ecn_marked", "RoCE packets received ECN-marked."),
    "out_of_sequence_packets_total": ("out_of_sequence", "Packets received out of sequence."),
    "retransmits_total": ("retransmits", "Retransmissions (adaptive, after NAKs)."),
    "timeouts_total": ("timeouts", "Retransmission timeouts."),
}


def families(prefix: str, sample: RdmaSample | None,
             cc: RdmaCcService | None) -> list[Family]:
    p = f"{prefix}_rdma"
    nbytes = counter(f"{p}_bytes_total", "Bytes through the port (the NIC counts 4-byte "
                     "words; converted).")
    packets = counter(f"{p}_packets_total", "Packets through the port.")
    others = {name: counter(f"{p}_{name}", text) for name, (_, text) in PORT_COUNTERS.items()}
    for port in sample.ports if sample is not None else ():
        labels = {"device": port.device, "port": str(port.port)}
        totals = port.totals
        for direction, short in (("receive", "rx"), ("transmit", "tx")):
            nbytes.add(getattr(totals, f"{short}_bytes"), direction=direction, **labels)
            packets.add(getattr(totals, f"{short}_packets"), direction=direction, **labels)
        for name, (field, _) in PORT_COUNTERS.items():
            others[name].add(getattr(totals, field), **labels)
    return [nbytes, packets, *others.values(), *_cc(p, cc)]


def _cc(p: str, cc: RdmaCcService | None) -> list[Family]:
    current = gauge(f"{p}_cc_setting", "A declared DCQCN setting's value now.")
    original = gauge(f"{p}_cc_setting_original",
                     "A setting's value before congestion control first changed it "
                     "(only settings it changed; put back at stop).")
    level = gauge(f"{p}_cc_level", "Where the device's steered settings are: 0 the "
                  "cautious end of each range, cc.steps the fast end.")
    changes = counter(f"{p}_cc_changes_total", "Settings congestion control changed.")
    failures = counter(f"{p}_cc_write_failures_total", "Settings it failed to write.")
    if cc is None:
        return [current, original, level, changes, failures]
    view = cc.describe()
    for device in view["devices"]:
        name = device["device"]
        level.add(device["level"], device=name)
        changes.add(device["changes"], device=name)
        for setting in device["settings"]:
            current.add(setting["current"], device=name, setting=setting["knob"])
            original.add(setting["original"], device=name, setting=setting["knob"])
    failures.add(view["failures"])
    return [current, original, level, changes, failures]
