"""The agent's tables: its status, links, GPUs, health, validations and remediation (the
rdma, energy and tuning tables have modules of their own).
"""

from __future__ import annotations

import time
from typing import Any

from harmonaize.tables import fields, table


def render_agent_status(result: dict[str, Any]) -> str:
    loop = result.get("loop", {})
    parts = [
        fields([
            ("host", result.get("host_id")),
            ("pool", result.get("pool")),
            ("gpu class", result.get("gpu_class")),
            ("version", result.get("version")),
            ("ready", result.get("ready")),
            ("health", result.get("health")),
            ("schedulable", result.get("schedulable")),
            ("interval", f"{result.get('interval_seconds', 0) * 1000:.0f} ms"),
            ("passes", loop.get("passes")),
            ("overruns", loop.get("overruns")),
            ("last pass", f"{loop.get('last_pass_seconds', 0) * 1e6:.0f} us"),
            ("uptime", f"{result.get('uptime_seconds', 0):.0f} s"),
        ]),
        "",
        table(result.get("observers", []), [
            ("name", "OBSERVER"), ("state", "STATE"), ("last_success", "OK"),
            ("last_duration_seconds", "SECONDS"), ("samples", "SAMPLES"),
            ("failures", "FAILURES"), ("detail", "DETAIL"),
        ]),
    ]
    holding = [c for c in result.get("conditions", []) if c.get("status") == "True"]
    parts += ["", table(holding, [
        ("type", "CONDITION"), ("severity", "SEVERITY"), ("reason", "REASON"),
        ("message", "MESSAGE"),
    ]) if holding else "no problem conditions"]
    holds = result.get("holds", [])
    parts += ["", table(holds, [("kind", "HOLD"), ("gpu", "GPU"), ("detail", "DETAIL")])
              if holds else "no holds: the host may take new work"]
    uplink = result.get("uplink")
    if uplink:
        parts += ["", fields([
            ("controller", uplink.get("endpoint")),
            ("last ack", "never" if uplink.get("last_ack_age_seconds") is None
             else f"{uplink['last_ack_age_seconds']:.1f} s ago"),
            ("sent / acked", f"{uplink.get('last_seq')} / {uplink.get('acked_seq')}"),
            ("queued", uplink.get("queued")),
            ("dropped events", uplink.get("dropped_events")),
        ])]
    else:
        parts += ["", "controller: none configured"]
    return "\n".join(parts)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _rate(bps: float | None) -> str:
    if bps is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.2f}{unit}"
    return f"{bps:.0f}"


def render_links(result: dict[str, Any]) -> str:
    rows = [
        {
            **link,
            "rx": _rate(link["rx_bps"]), "tx": _rate(link["tx_bps"]),
            "rx_util": _pct(link["rx_utilization"]), "tx_util": _pct(link["tx_utilization"]),
            "ce": _pct(link["ce_fraction"]),
            "retx": f"{link['retransmits_per_s']:.1f}", "drops": f"{link['drops_per_s']:.1f}",
            "speed": "-" if link["speed_mbps"] is None else f"{link['speed_mbps']}M",
            "tclasses": " ".join(
                f"{c}:{_rate(v['rx_bps'] + v['tx_bps'])}"
                for c, v in sorted(link.get("traffic_classes", {}).items())),
        }
        for link in result.get("links", [])
    ]
    parts = [f"links: {result.get('state')} ({result.get('mode')}): {result.get('detail')}"]
    if rows:
        parts += ["", table(rows, [
            ("name", "LINK"), ("class", "CLASS"), ("up", "UP"), ("speed", "SPEED"),
            ("rx", "RX b/s"), ("tx", "TX b/s"), ("rx_util", "RX%"), ("tx_util", "TX%"),
            ("ce", "CE%"), ("retx", "RETX/s"), ("drops", "DROP/s"),
            ("congestion", "CONGESTION"), ("errors", "ERRORS"), ("tclasses", "CLASSES"),
        ])]
    ports = [
        {**port, "rx": _rate(port["rx_bps"]), "tx": _rate(port["tx_bps"]),
         "util": _pct(max((u for u in (port["rx_utilization"], port["tx_utilization"])
                           if u is not None), default=None)),
         "cnp": f"{port['cnp_handled_per_s']:.0f}/{port['cnp_sent_per_s']:.0f}"}
        for port in result.get("rdma", [])
    ]
    if ports:
        parts += ["", table(ports, [
            ("name", "RDMA PORT"), ("netdev", "NETDEV"), ("state", "STATE"), ("rx", "RX b/s"),
            ("tx", "TX b/s"), ("util", "UTIL"), ("cnp", "CNP IN/OUT"),
            ("congestion", "CONGESTION"), ("errors", "ERRORS"),
        ])]
    drops = result.get("drops_by_reason") or {}
    if drops:
        parts += ["", "kernel drops (per s, total since start): " + ", ".join(
            f"{k} {v['per_s']:.1f} ({v['total']})"
            for k, v in sorted(drops.items(), key=lambda kv: (-kv[1]["per_s"], -kv[1]["total"])))]
    return "\n".join(parts)


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**30:.0f}"


def render_gpus(result: dict[str, Any]) -> str:
    rows = []
    for gpu in result.get("gpus", []):
        counters = gpu.get("counters", {})
        rows.append({
            **gpu,
            "temp": gpu["temperature_c"],
            "power": "-" if gpu["power_w"] is None else f"{gpu['power_w']:.0f}W",
            "mem": f"{_gib(gpu['mem_used'])}/{_gib(gpu['mem_total'])}G",
            "ecc": f"{counters.get('ecc_sbe_volatile')}/{counters.get('ecc_dbe_volatile')}",
            "remap": "pending" if counters.get("remap_pending") else (
                "failed" if counters.get("remap_failure") else
                f"{counters.get('remap_correctable')}/{counters.get('remap_uncorrectable')}"),
            "pcie": f"g{gpu['pcie_gen']}/{gpu['pcie_max_gen']} x{gpu['pcie_width']}/"
                    f"{gpu['pcie_max_width']} r{counters.get('pcie_replay', '-')}",
            "nvlink": f"{gpu['nvlinks_up']}/{gpu['nvlinks']}" if gpu["nvlinks"] else "-",
            "job": ",".join(f"{j['job']}" + (f":{j['rank']}" if j.get("rank") else "")
                            for j in gpu.get("jobs", [])) or "-",
        })
    parts = [f"gpus: {result.get('state')}: {result.get('detail')}"]
    if rows:
        parts += ["", table(rows, [
            ("index", "GPU"), ("name", "NAME"), ("state", "STATE"), ("temp", "TEMP"),
            ("power", "POWER"), ("util_gpu", "UTIL"), ("mem", "MEM"), ("ecc", "ECC S/D"),
            ("remap", "REMAP C/U"), ("pcie", "PCIE"), ("nvlink", "NVLINK"), ("xids", "XIDS"),
            ("job", "JOB"), ("action", "ACTION"),
        ])]
    xids = [{"gpu": gpu["index"], "age": _age(x["at"]), **x,
             "job": x.get("job") or "-"}
            for gpu in result.get("gpus", []) for x in gpu.get("recent_xids", [])]
    if xids:
        parts += ["", table(xids, [("gpu", "GPU"), ("age", "AGO"), ("xid", "XID"),
                                   ("verdict", "CLASS"), ("job", "JOB"), ("why", "WHY")])]
    return "\n".join(parts)


def _age(since: float) -> str:
    seconds = max(0.0, time.time() - since)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def render_health(result: dict[str, Any]) -> str:
    counts = result.get("gpu_counts", {})
    parts = [fields([
        ("health", result.get("health")),
        ("schedulable", result.get("schedulable")),
        ("recommended", result.get("action")),
        ("gpus", ", ".join(f"{k} {v}" for k, v in counts.items() if v) or "none"),
        ("advisories", result.get("advisories_sent")),
    ])]
    holding = [c for c in result.get("conditions", []) if c.get("status") == "True"]
    if holding:
        parts += ["", table(holding, [("type", "HOST CONDITION"), ("severity", "SEVERITY"),
                                      ("message", "WHY")])]
    unhealthy = [g for g in result.get("gpus", []) if g["state"] != "healthy" or g["conditions"]]
    for gpu in unhealthy:
        parts += ["", f"gpu {gpu['index']}: {gpu['state']} for {_age(gpu['since'])}: "
                      f"{gpu['why']} -> {gpu['action']}"]
        if gpu["conditions"]:
            parts.append(table(gpu["conditions"], [
                ("type", "  CONDITION"), ("severity", "SEVERITY"), ("action", "ACTION"),
                ("message", "WHY")]))
    if not unhealthy:
        parts += ["", "every GPU is healthy"]
    return "\n".join(parts)


def render_validations(result: dict[str, Any]) -> str:
    parts = [fields([
        ("running", ", ".join(result.get("running", [])) or "none"),
        ("scheduled", ", ".join(result.get("scheduled", {})) or "none"),
        ("requested", ", ".join(result.get("requested", [])) or "none"),
        ("quarantined", ", ".join(f"gpu {q['gpu']} ({q['action']})"
                                  for q in result.get("quarantined", [])) or "none"),
    ])]
    parts += [f"waiting: {key}: {why}" for key, why in result.get("waiting", {}).items()]
    rows = [{**r, "when": time.strftime("%m-%d %H:%M:%S", time.localtime(r["started"]))}
            for r in result.get("history", [])]
    if rows:
        parts += ["", table(rows, [
            ("id", "ID"), ("when", "STARTED"), ("target", "TARGET"), ("level", "LEVEL"),
            ("trigger", "TRIGGER"), ("outcome", "OUTCOME"), ("action", "ACTION"),
            ("reason", "REASON"),
        ])]
    steps = [{**r, "when": time.strftime("%m-%d %H:%M:%S", time.localtime(r["at"]))}
             for r in result.get("remediation", [])]
    if steps:
        parts += ["", "remediation:", table(steps, [
            ("when", "WHEN"), ("gpu", "GPU"), ("step", "STEP"), ("trigger", "TRIGGER"),
            ("detail", "DETAIL")])]
    return "\n".join(parts)


def render_remediation(result: dict[str, Any]) -> str:
    if not result.get("enabled"):
        return "remediation is off (remediation.enabled = false)"
    parts = [fields([("mode", result.get("mode")),
                     ("holds", ", ".join(f"{h['kind']} gpu {h['gpu']}"
                                         for h in result.get("holds", [])) or "none")])]
    if result.get("gpus"):
        parts += ["", table(result["gpus"], [("gpu", "GPU"), ("phase", "PHASE"),
                                             ("failures", "FAILED RESETS"),
                                             ("detail", "WHY")])]
    rows = [{**r, "when": time.strftime("%m-%d %H:%M:%S", time.localtime(r["at"]))}
            for r in result.get("steps", [])]
    if rows:
        parts += ["", table(rows, [("when", "WHEN"), ("gpu", "GPU"), ("step", "STEP"),
                                   ("trigger", "TRIGGER"), ("detail", "DETAIL")])]
    return "\n".join(parts)
