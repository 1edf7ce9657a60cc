"""``harmonctl``: the operator's command line for the agent and the controller.

It talks to the agent's local socket (default ``/run/harmonaize/agent.sock``),
or with ``-C`` to the controller's admin socket. Every command prints a table,
or JSON with ``--json``.
"""

# Over 400 lines because one CLI with one parser; the renderers for each command's table are
# short and use the same helpers (harmonaize/tables.py, harmonaize/tuningtables.py).

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shtab

from harmonaize import keys
from harmonaize.energytables import render_energy
from harmonaize.opsocket import CommandError, request
from harmonaize.rdmatables import render_rdma
from harmonaize.schedulertables import SCHEDULER_COMMANDS, render_scheduler
from harmonaize.tables import fields, table
from harmonaize.tuningtables import render_jobs, render_policy

AGENT_SOCKET = "/run/harmonaize/agent.sock"
CONTROLLER_SOCKET = "/run/harmonaize/controller.sock"
DEFAULT_KEYS_DIR = "/etc/harmonaize/keys"


def _render_agent_status(result: dict[str, Any]) -> str:
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


def _render_links(result: dict[str, Any]) -> str:
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


def _render_gpus(result: dict[str, Any]) -> str:
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
    return "\n".join(parts)


def _age(since: float) -> str:
    seconds = max(0.0, time.time() - since)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _render_health(result: dict[str, Any]) -> str:
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


def _render_validations(result: dict[str, Any]) -> str:
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


def _render_remediation(result: dict[str, Any]) -> str:
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


def _render_controller_status(result: dict[str, Any]) -> str:
    hosts = result.get("hosts", {})
    return fields([
        ("version", result.get("version")),
        ("listen", result.get("listen")),
        ("feed", result.get("feed")),
        ("database", result.get("database")),
        ("hosts", f"{hosts.get('alive')} alive of {hosts.get('known')}"),
        ("frames", result.get("frames")),
        ("rejected", json.dumps(result.get("rejected", {}), sort_keys=True)),
        ("protocol", json.dumps(result.get("protocol", {}), sort_keys=True)),
        ("feed", json.dumps(result.get("feed_stats", {}), sort_keys=True)),
        ("uptime", f"{result.get('uptime_seconds', 0):.0f} s"),
        *_cluster_fields(result.get("cluster")),
    ])


def _cluster_fields(cluster: dict[str, Any] | None) -> list[tuple[str, Any]]:
    """A replica's part of ``-C status``: who leads, who is present, this one's share."""
    if not cluster:
        return []
    leading = cluster.get("leading")
    replicas = cluster.get("replicas") or {}
    return [
        ("replica", f"{cluster.get('replica')} (bus {cluster.get('bus')})"),
        ("leader", cluster.get("leader") or "none (an election is under way)"),
        ("leading", "no" if not leading else
         f"yes: term {leading.get('terms')}, commit {leading.get('commit')}, agents' stream "
         f"{leading.get('agents_stream')}, {leading.get('hosts')} hosts, queued "
         f"{leading.get('queued')}"),
        ("replicas", ", ".join(f"{name} ({info.get('agents', 0)} agents)"
                               for name, info in sorted(replicas.items())) or "-"),
        ("agents here", cluster.get("agents_here")),
        ("feed position", cluster.get("feed_position")),
        ("ingest", json.dumps(cluster.get("ingest", {}), sort_keys=True)),
    ]


def _render_hosts(rows: list[dict[str, Any]]) -> str:
    return table(rows, [
        ("host_id", "HOST"), ("pool", "POOL"), ("gpu_class", "CLASS"), ("gpus", "GPUS"),
        ("alive", "ALIVE"), ("health", "HEALTH"), ("schedulable", "SCHED"),
        ("last_seen_seconds", "SEEN(S)"), ("down_reason", "DOWN REASON"),
    ])


def _render_capacity(rows: list[dict[str, Any]]) -> str:
    """What tenants see now: pools' capacity, then jobs' conditions (each their own table)."""
    pools = [
        {**row, **{k: _bucket(row[k]) for k in ("hosts_up", "hosts_down", "gpus_available")}}
        for row in rows if row.get("kind") == "pool-capacity"
    ]
    out = table(pools, [
        ("topic", "TOPIC"), ("hosts_up", "HOSTS UP"), ("hosts_down", "HOSTS DOWN"),
        ("gpus_available", "GPUS"), ("trend", "TREND"), ("revision", "REV"),
    ])
    jobs = [{**row, "degraded": ", ".join(row.get("degraded", ())) or "-",
             "lost": ", ".join(row.get("lost", ())) or "-"}
            for row in rows if row.get("kind") == "job-health"]
    if jobs:
        out += "\n\n" + table(jobs, [
            ("topic", "JOB TOPIC"), ("tenant", "TENANT"), ("degraded", "DEGRADED"),
            ("lost", "LOST"), ("congestion", "CONGESTION"), ("tuning_choice", "TUNING"),
            ("tuning", "RANKS"), ("revision", "REV"),
        ])
    return out


def _bucket(value: dict[str, Any]) -> str:
    lo, hi = value.get("lo"), value.get("hi")
    if hi is None:
        return f"{lo}+"
    return str(lo) if lo == hi else f"{lo}-{hi}"


def _render_events(rows: list[dict[str, Any]]) -> str:
    return table(rows, [
        ("host_id", "HOST"), ("seq", "SEQ"), ("severity", "SEVERITY"), ("reason", "REASON"),
        ("message", "MESSAGE"),
    ])


def _render_jobs(rows: list[dict[str, Any]]) -> str:
    return table([{"job": r["job"], "tenant": r["tenant"],
                   "hosts": len({m["host_id"] for m in r["members"]}),
                   "members": ", ".join(m["name"] for m in r["members"][:8])
                   + (" ..." if len(r["members"]) > 8 else "")} for r in rows],
                 [("job", "JOB"), ("tenant", "TENANT"), ("hosts", "HOSTS"),
                  ("members", "MEMBERS")])


def _render_feed(rows: list[dict[str, Any]]) -> str:
    return table([{**r, "topics": ", ".join(r["topics"])} for r in rows], [
        ("tenant", "TENANT"), ("topics", "TOPICS"), ("connected_seconds", "FOR(S)"),
        ("sent", "SENT"), ("dropped", "DROPPED"), ("refused", "REFUSED"),
    ])


def _render_tenants(rows: list[dict[str, Any]]) -> str:
    return table([{**r, "key": "yes" if r["key"] else "no", "jobs": ", ".join(r["jobs"]) or "-",
                   "declared": ", ".join(r["declared"]) or "-"} for r in rows], [
        ("tenant", "TENANT"), ("key", "KEY"), ("jobs", "JOBS"), ("declared", "DECLARED"),
        ("subscribers", "SUBSCRIBERS"), ("dropped", "DROPPED"),
    ])


def _render_pools(rows: list[dict[str, Any]]) -> str:
    return table(rows, [
        ("pool", "POOL"), ("gpu_class", "CLASS"), ("hosts", "HOSTS"), ("alive", "ALIVE"),
        ("schedulable", "SCHEDULABLE"), ("gpus", "GPUS"), ("gpus_healthy", "HEALTHY"),
        ("gpus_in_use", "IN USE"),
    ])


def _render_privacy(result: dict[str, Any]) -> str:
    head = fields([("mode", result["mode"]),
                   ("epsilon per pool per day", result["epsilon_per_day"]),
                   ("release interval s", result["release_interval"]),
                   ("GPUs per host (sensitivity)", result["host_gpus"]),
                   ("releases refused (budget spent)", result["refused"])])
    if result["mode"] != "private":
        return head + "\nno differential privacy in this mode: nothing is spent"
    rows = [{**r, "host_noise_scale": "-" if r["host_noise_scale"] is None
             else r["host_noise_scale"], "next_release_in": "-" if r["next_release_in"] is None
             else r["next_release_in"]} for r in result["pools"]]
    return head + "\n\n" + table(rows, [
        ("pool", "POOL"), ("gpu_class", "CLASS"), ("spent_24h", "SPENT 24H"),
        ("budget", "BUDGET"), ("releases_24h", "RELEASES 24H"),
        ("epsilon_per_release", "EPS/RELEASE"), ("gpu_noise_scale", "GPU NOISE"),
        ("host_noise_scale", "HOST NOISE"), ("next_release_in", "NEXT IN S"),
    ])


def _render_simple(result: Any) -> str:
    if isinstance(result, dict):
        return fields(result.items())
    return json.dumps(result, indent=2)


def _render_help(result: dict[str, Any]) -> str:
    rows = [{"command": name, "who": "root" if info.get("root_only") else "group",
             "help": info.get("help")} for name, info in sorted(result.items())]
    return table(rows, [("command", "COMMAND"), ("who", "WHO"), ("help", "WHAT")])


Renderer = Callable[[Any], str]
AGENT_RENDERERS: dict[str, Renderer] = {
    "status": _render_agent_status,
    "links": _render_links,
    "rdma": render_rdma,
    "gpus": _render_gpus,
    "health": _render_health,
    "energy": render_energy,
    "validations": _render_validations,
    "remediation": _render_remediation,
    "jobs": render_jobs,
    "policy": render_policy,
    "help": _render_help,
}
CONTROLLER_RENDERERS: dict[str, Renderer] = {
    "status": _render_controller_status,
    "hosts": _render_hosts,
    "capacity": _render_capacity,
    "events": _render_events,
    "jobs": _render_jobs,
    "feed": _render_feed,
    "tenants": _render_tenants,
    "pools": _render_pools,
    "privacy": _render_privacy,
    "scheduler": render_scheduler,
    "scheduler-cancel": render_scheduler,
    "scheduler-release": render_scheduler,
    "scheduler-pause": render_scheduler,
    "scheduler-resume": render_scheduler,
    "help": _render_help,
}


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print JSON instead of a table")
    parser = argparse.ArgumentParser(
        prog="harmonctl", parents=[common],
        description="Operator CLI for the HarmonAIze agent (local socket) and controller (-C).",
    )
    parser.add_argument("-s", "--socket",
                        default=os.environ.get("HARMONCTL_SOCKET", AGENT_SOCKET),
                        help="agent socket (default %(default)s, or $HARMONCTL_SOCKET)",
                        ).complete = shtab.FILE  # type: ignore[attr-defined]
    parser.add_argument("-C", "--controller", nargs="?", metavar="ADMIN_SOCKET",
                        const=os.environ.get("HARMONCTL_ADMIN_SOCKET", CONTROLLER_SOCKET),
                        help="talk to the controller's admin socket instead "
                        f"(default {CONTROLLER_SOCKET}, or $HARMONCTL_ADMIN_SOCKET)",
                        ).complete = SOCKET_OR_COMMAND  # type: ignore[attr-defined]
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a reply")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("status", parents=[common], help="agent (or controller) status")
    sub.add_parser("links", parents=[common], help="link rates, traffic classes, congestion")
    sub.add_parser("rdma", parents=[common],
                   help="RDMA ports' counters; congestion control's values and why")
    sub.add_parser("gpus", parents=[common], help="GPU telemetry, counters, state and jobs")
    sub.add_parser("health", parents=[common],
                   help="why the host and each GPU are in their state, and what to do")
    sub.add_parser("energy", parents=[common],
                   help="power limits per GPU: set, original, draw, energy saved, and why")
    drain = sub.add_parser("drain", parents=[common],
                           help="withdraw this host (or one GPU, --gpu) from capacity")
    drain.add_argument("--reason", default="drained by operator")
    drain.add_argument("--gpu", type=int, help="drain only this GPU (quarantine it)")
    validate = sub.add_parser("validate", parents=[common],
                              help="validate a GPU (--gpu N) or the host (--host)")
    target = validate.add_mutually_exclusive_group(required=True)
    target.add_argument("--gpu", type=int)
    target.add_argument("--host", action="store_true")
    validate.add_argument("--level", type=int, choices=(1, 2, 3))
    validations = sub.add_parser("validations", parents=[common],
                                 help="validation history and what is running or waiting")
    validations.add_argument("--limit", type=int, default=20)
    release = sub.add_parser("release", parents=[common],
                             help="validate a quarantined GPU and release it if it passes")
    release.add_argument("--gpu", type=int, required=True)
    release.add_argument("--force", action="store_true", help="release without validating")
    declare = sub.add_parser("declare", parents=[common],
                             help="set a job's declaration on this host from a JSON file")
    declare.add_argument("file", type=argparse.FileType("r")).complete = (  # type: ignore[attr-defined]
        shtab.FILE)
    declare.add_argument("--group", default=None,
                         help="Unix group (name or number) of the job's processes here: only "
                         "its members may read and follow the job's tuner policy")
    sub.add_parser("undrain", parents=[common], help="return this host to capacity")
    remediation = sub.add_parser("remediation", parents=[common],
                                 help="GPU remediation: phases, holds, steps; cancel, resume, "
                                 "clear (RMA)")
    remediation.add_argument("action", nargs="?", default="status",
                             choices=("status", "cancel", "resume", "clear"))
    remediation.add_argument("--gpu", type=int)
    remediation.add_argument("--limit", type=int, default=20)
    sub.add_parser("reload", parents=[common],
                   help="make the agent (-C: the controller) re-read its configuration")
    sub.add_parser("hosts", parents=[common], help="(controller) every known host")
    sub.add_parser("capacity", parents=[common], help="(controller) tenant-visible capacity")
    events = sub.add_parser("events", parents=[common], help="(controller) recent host events")
    sub.add_parser("jobs", parents=[common],
                   help="declared jobs and their tuning choice (-C: jobs' placements)")
    policy = sub.add_parser("policy", parents=[common],
                            help="a job's declaration, policy, reason and history")
    policy.add_argument("job")
    place = sub.add_parser("place", parents=[common],
                           help="(controller) record a job's placement from a JSON file: "
                           '{"job", "tenant", "members": [{"name", "host"}]}')
    place.add_argument("file", type=argparse.FileType("r")).complete = (  # type: ignore[attr-defined]
        shtab.FILE)
    unplace = sub.add_parser("unplace", parents=[common], help="(controller) forget a job")
    unplace.add_argument("job")
    events.add_argument("--limit", type=int, default=50)
    sub.add_parser("feed", parents=[common],
                   help="(controller) tenant subscribers: topics, sent, dropped")
    sub.add_parser("tenants", parents=[common],
                   help="(controller) tenants: key, jobs, declarations, subscribers")
    sub.add_parser("pools", parents=[common], help="(controller) pools: hosts and GPUs")
    sub.add_parser("privacy", parents=[common],
                   help="(controller) the private feed's ε spent per pool over 24 h")
    token = sub.add_parser("token", parents=[common],
                           help="(controller) tenants' HTTP gateway tokens: issue, list, revoke")
    token_sub = token.add_subparsers(dest="action", required=True, metavar="ACTION")
    issue = token_sub.add_parser("issue", parents=[common],
                                 help="issue a tenant a bearer token (shown once)")
    issue.add_argument("--tenant", required=True)
    issue.add_argument("--days", type=float, default=90.0, help="valid this long (default 90)")
    issue.add_argument("--note", default="", help="what it is for, for the list")
    token_sub.add_parser("list", parents=[common], help="every token, without secrets")
    revoke = token_sub.add_parser("revoke", parents=[common], help="revoke a token by its id")
    revoke.add_argument("id")
    scheduler = sub.add_parser(
        "scheduler", parents=[common],
        help="(controller) drains in the provider's scheduler: view; cancel or release a "
        "node; pause or resume all")
    scheduler.add_argument("action", nargs="?", default="view", choices=tuple(SCHEDULER_COMMANDS),
                           help="view (default); cancel NODE: leave it alone until release "
                           "NODE; pause: leave every node alone until resume")
    scheduler.add_argument("node", nargs="?", help="the node, for cancel and release")
    keygen = sub.add_parser("keygen", parents=[common],
                            help="make a CurveZMQ key pair (local: talks to no daemon)")
    keygen.add_argument("name", help="controller, a host id, or a tenant name")
    keygen.add_argument("--dir", type=Path, default=Path(DEFAULT_KEYS_DIR),
                        help="where to write NAME.key and NAME.key_secret (default %(default)s)",
                        ).complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    sub.add_parser("help", parents=[common], help="commands the server offers")
    watch = sub.add_parser("watch", parents=[common],
                           help="redraw a read-only command every second until Ctrl-C "
                           "(--json: one JSON line per update)")
    watch.add_argument("watched", nargs="?", default="status", choices=WATCHABLE,
                       metavar="COMMAND", help="what to show (default status)")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between updates")
    watch.add_argument("--count", type=int, help="stop after this many updates")
    watch.add_argument("--limit", type=int, help="with events or validations: how many")
    completion = sub.add_parser("completion", parents=[common],
                                help="print a shell completion script (local)")
    completion.add_argument("shell", choices=("bash", "zsh"))
    return parser


#: Commands ``watch`` may repeat: they only read.
WATCHABLE = ("status", "links", "rdma", "gpus", "health", "validations", "remediation",
             "hosts", "capacity", "events", "jobs", "feed", "tenants", "pools", "privacy",
             "energy", "scheduler")
#: Commands answered by harmonctl itself, without a daemon.
LOCAL = ("keygen", "watch", "completion")


def _args_for(ns: argparse.Namespace) -> dict[str, Any]:
    if ns.command == "drain":
        return {"reason": ns.reason, **({"gpu": ns.gpu} if ns.gpu is not None else {})}
    if ns.command == "events":
        return {"limit": ns.limit}
    if ns.command == "validate":
        args: dict[str, Any] = {"host": True} if ns.host else {"gpu": ns.gpu}
        return {**args, **({"level": ns.level} if ns.level else {})}
    if ns.command == "validations":
        return {"limit": ns.limit}
    if ns.command == "release":
        return {"gpu": ns.gpu, "force": ns.force}
    if ns.command == "remediation":
        if ns.action == "status":
            return {"limit": ns.limit}
        if ns.gpu is None:
            raise SystemExit(f"harmonctl: remediation {ns.action} needs --gpu N")
        return {"gpu": ns.gpu}
    if ns.command == "declare":
        declaration = _json_file(ns.file)
        if ns.group is not None and isinstance(declaration, dict):
            declaration = {**declaration, "group": ns.group}
        return {"declaration": declaration}
    if ns.command == "place":
        placement = _json_file(ns.file)
        if not isinstance(placement, dict):
            raise SystemExit(f"harmonctl: {ns.file.name}: expected a JSON object")
        return placement
    if ns.command in ("unplace", "policy"):
        return {"job": ns.job}
    if ns.command == "token" and ns.action == "issue":
        return {"tenant": ns.tenant, "days": ns.days, "note": ns.note}
    if ns.command == "token" and ns.action == "revoke":
        return {"id": ns.id}
    if ns.command == "scheduler" and ns.action in ("cancel", "release"):
        if not ns.node:
            raise SystemExit(f"harmonctl: scheduler {ns.action} needs a NODE")
        return {"node": ns.node}
    return {}


#: ``token ACTION`` is one of three admin commands.
TOKEN_COMMANDS = {"issue": "token-issue", "list": "tokens", "revoke": "token-revoke"}


def _command(ns: argparse.Namespace) -> str:
    if ns.command == "scheduler":
        return SCHEDULER_COMMANDS[ns.action]
    if ns.command == "remediation" and ns.action != "status":
        return f"remediation-{ns.action}"
    return TOKEN_COMMANDS[ns.action] if ns.command == "token" else ns.command


def _json_file(file: Any) -> Any:
    try:
        return json.load(file)
    except ValueError as exc:
        raise SystemExit(f"harmonctl: {file.name}: not JSON: {exc}") from None


def _keygen(ns: argparse.Namespace, as_json: bool) -> int:
    try:
        public, secret = keys.generate(ns.dir, ns.name)
    except keys.KeyFileError as exc:
        print(f"harmonctl: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps({"public": str(public), "secret": str(secret)}))
    else:
        print(f"{secret} (stays on this machine)\n{public} (copy to the peers that must "
              "know it)")
    return 0


class Failure(Exception):
    """Talking to a daemon failed; the message says what to do about it."""


def call(ns: argparse.Namespace, command: str, args: dict[str, Any]) -> Any:
    """One request to the agent (or with -C the controller); raises :class:`Failure`."""
    path = ns.controller or ns.socket
    who = "controller" if ns.controller else "agent"
    try:
        return request(path, command, args, timeout=ns.timeout)
    except FileNotFoundError:
        raise Failure(f"no {who} socket at {path}: is harmonaize-{who} running?") from None
    except PermissionError:
        raise Failure(f"permission denied on {path}: use root, or join the socket's group "
                      "(harmonaize)") from None
    except ConnectionRefusedError:
        raise Failure(f"{path} refuses connections: harmonaize-{who} is not running") from None
    except TimeoutError:
        raise Failure(f"the {who} did not answer within {ns.timeout:g} s") from None
    except CommandError as exc:
        message = str(exc)
        if message == "permission denied":  # the daemon's verdict on our uid and groups
            message += ": use root, or join the socket's group (harmonaize)"
        raise Failure(message) from None
    except OSError as exc:
        reason = errno.errorcode.get(exc.errno or 0, "error")
        raise Failure(f"cannot talk to {path}: {exc.strerror or reason}") from None
    except ValueError as exc:  # not JSON: something else listens there
        raise Failure(f"{path} did not answer in the operator protocol: {exc}") from None


def render(ns: argparse.Namespace, command: str, result: Any) -> str:
    renderers = CONTROLLER_RENDERERS if ns.controller else AGENT_RENDERERS
    return renderers.get(command, _render_simple)(result)


def _watch(ns: argparse.Namespace, as_json: bool) -> int:
    """Redraw ``ns.watched`` every ``--interval`` seconds; Ctrl-C ends it (status 0)."""
    if ns.interval <= 0 or (ns.count is not None and ns.count < 1):
        print("harmonctl: --interval and --count must be positive", file=sys.stderr)
        return 2
    args = {"limit": ns.limit} if ns.limit is not None else {}
    tty = sys.stdout.isatty()
    began = time.monotonic()
    ok = False
    shown = 0
    try:
        while ns.count is None or shown < ns.count:
            if shown:  # on a fixed grid, so a slow answer does not make the view drift
                time.sleep(max(0.0, began + shown * ns.interval - time.monotonic()))
            shown += 1
            try:
                result = call(ns, ns.watched, args)
                ok = True
            except Failure as exc:
                ok = False
                result, error = None, str(exc)
            if as_json:
                line = {"result": result} if ok else {"error": error}
                print(json.dumps({"time": round(time.time(), 3), **line}, sort_keys=True),
                      flush=True)
                continue
            body = render(ns, ns.watched, result) if ok else f"harmonctl: {error}"
            header = (f"harmonctl {ns.watched}, every {ns.interval:g} s (Ctrl-C ends)"
                      f"    {time.strftime('%H:%M:%S')}")
            # Home and clear on a terminal; a pipe gets the frames one after the other.
            sys.stdout.write(("\x1b[H\x1b[2J" if tty else "") + f"{header}\n\n{body}\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    return 0 if ok else 1


def _normalize(argv: list[str]) -> list[str]:
    """``-C hosts`` means the default admin socket, not a socket named "hosts"."""
    commands = set(_command_names())
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in ("-C", "--controller") and out[i + 1] in commands:
            out[i] = "--controller=" + os.environ.get("HARMONCTL_ADMIN_SOCKET",
                                                      CONTROLLER_SOCKET)
    return out


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _command_names() -> list[str]:
    return list(subcommands(build_parser()))


#: ``-C`` takes an optional admin socket: after it, offer the commands and files.
SOCKET_OR_COMMAND = {"bash": "_harmonctl_socket_or_command", "zsh": "_files"}


def completion_script(shell: str) -> str:
    """The shell's completion script, generated by shtab from the parser itself, so it
    never falls behind the CLI (commands, options, choices, files where a path goes)."""
    preamble = {"bash": "_harmonctl_socket_or_command() {\n"
                        f"    compgen -W {shlex.quote(' '.join(_command_names()))} -- \"$1\"\n"
                        "    compgen -f -- \"$1\"\n}\n"}.get(shell, "")
    return shtab.complete(build_parser(), shell=shell, preamble=preamble)


def main(argv: list[str] | None = None) -> int:
    argv = _normalize(sys.argv[1:] if argv is None else argv)
    ns = build_parser().parse_args(argv)
    as_json = getattr(ns, "json", False)
    if ns.command == "keygen":
        return _keygen(ns, as_json)
    if ns.command == "completion":
        script = completion_script(ns.shell)
        if as_json:
            print(json.dumps({"shell": ns.shell, "script": script}))
        else:
            print(script, end="")
        return 0
    if ns.command == "watch":
        return _watch(ns, as_json)
    try:
        result = call(ns, _command(ns), _args_for(ns))
    except Failure as exc:
        print(f"harmonctl: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(render(ns, _command(ns), result))
    return 0

if __name__ == "__main__":
    sys.exit(main())
