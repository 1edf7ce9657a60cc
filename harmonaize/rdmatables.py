"""``harmonctl rdma``: RDMA ports' counters, and congestion control's settings and reasons."""

from __future__ import annotations

from typing import Any

from harmonaize.tables import table


def render_rdma(result: dict[str, Any]) -> str:
    ports = [{**port, **port["totals"]} for port in result.get("ports", [])]
    parts = [table(ports, [
        ("name", "PORT"), ("netdev", "NETDEV"), ("state", "STATE"), ("tx_packets", "TX PKTS"),
        ("rx_packets", "RX PKTS"), ("cnp_handled", "CNP HANDLED"), ("cnp_ignored", "IGNORED"),
        ("cnp_sent", "CNP SENT"), ("ecn_marked", "ECN MARKED"),
        ("out_of_sequence", "OUT OF SEQ"), ("retransmits", "RETRANS"), ("timeouts", "TIMEOUTS"),
    ]) if ports else "no RDMA ports observed"]
    cc = result.get("cc") or {}
    if not cc.get("enabled"):
        parts += ["", "congestion control: off (rdma.cc.enabled)"]
        return "\n".join(parts)
    parts += ["", f"congestion control: a decision per device every {cc.get('window')} s"
              + (f"; {cc['refused']}" if cc.get("refused") else "")]
    if cc.get("restored_at_start"):
        parts.append(f"put back at start: {cc['restored_at_start']} value(s) a killed agent "
                     "left changed")
    for device in cc.get("devices", []):
        where = device.get("where") or device.get("error")
        level = "-" if device.get("level") is None else f"{device['level']}/{device['steps']}"
        parts += ["", f"{device['device']} (port {device.get('port') or '?'}, "
                  f"{device.get('layout') or 'no layout'}: {where}): level {level}; "
                  f"{device.get('waiting') or 'changed at the last window'}"]
        rows = [{**s, "range": f"{s['range'][0]}-{s['range'][1]}"
                 if isinstance(s["range"], list) else s["range"]}
                for s in device.get("settings", [])]
        parts.append(table(rows, [("knob", "SETTING"), ("range", "RANGE"), ("unit", "UNIT"),
                                  ("current", "NOW"), ("original", "ORIGINAL")]))
    history = cc.get("history", [])[:20]
    if history:
        parts += ["", table(history, [("device", "DEVICE"), ("knob", "SETTING"),
                                      ("previous", "FROM"), ("value", "TO"),
                                      ("outcome", "OUTCOME"), ("reason", "WHY")])]
    return "\n".join(parts)
