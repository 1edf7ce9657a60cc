"""The controller's tables: its status and cluster, hosts, capacity, events, placements,
the feed's subscribers, tenants, pools and the private feed's budget.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from harmonaize.tables import fields, table


def render_controller_status(result: dict[str, Any]) -> str:
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
        ("leader", cluster.get("leader") or ("unknown (the bus did not answer in time)"
                                             if cluster.get("leader_unread")
                                             else "none (an election is under way)")),
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


def render_hosts(rows: list[dict[str, Any]]) -> str:
    return table(rows, [
        ("host_id", "HOST"), ("pool", "POOL"), ("gpu_class", "CLASS"), ("gpus", "GPUS"),
        ("alive", "ALIVE"), ("health", "HEALTH"), ("schedulable", "SCHED"),
        ("last_seen_seconds", "SEEN(S)"), ("down_reason", "DOWN REASON"),
    ])


def render_capacity(rows: list[dict[str, Any]]) -> str:
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


def render_events(rows: list[dict[str, Any]]) -> str:
    return table(rows, [
        ("host_id", "HOST"), ("seq", "SEQ"), ("severity", "SEVERITY"), ("reason", "REASON"),
        ("message", "MESSAGE"),
    ])


def render_placements(rows: list[dict[str, Any]]) -> str:
    return table([{"job": r["job"], "tenant": r["tenant"],
                   "hosts": len({m["host_id"] for m in r["members"]}),
                   "members": ", ".join(m["name"] for m in r["members"][:8])
                   + (" ..." if len(r["members"]) > 8 else "")} for r in rows],
                 [("job", "JOB"), ("tenant", "TENANT"), ("hosts", "HOSTS"),
                  ("members", "MEMBERS")])


def render_feed(rows: list[dict[str, Any]]) -> str:
    return table([{**r, "topics": ", ".join(r["topics"])} for r in rows], [
        ("tenant", "TENANT"), ("topics", "TOPICS"), ("connected_seconds", "FOR(S)"),
        ("sent", "SENT"), ("dropped", "DROPPED"), ("refused", "REFUSED"),
    ])


def render_tenants(rows: list[dict[str, Any]]) -> str:
    return table([{**r, "key": "yes" if r["key"] else "no", "jobs": ", ".join(r["jobs"]) or "-",
                   "declared": ", ".join(r["declared"]) or "-"} for r in rows], [
        ("tenant", "TENANT"), ("key", "KEY"), ("jobs", "JOBS"), ("declared", "DECLARED"),
        ("subscribers", "SUBSCRIBERS"), ("dropped", "DROPPED"),
    ])


def render_pools(rows: list[dict[str, Any]]) -> str:
    return table(rows, [
        ("pool", "POOL"), ("gpu_class", "CLASS"), ("hosts", "HOSTS"), ("alive", "ALIVE"),
        ("schedulable", "SCHEDULABLE"), ("gpus", "GPUS"), ("gpus_healthy", "HEALTHY"),
        ("gpus_in_use", "IN USE"),
    ])


def _unit(result: dict[str, Any]) -> str:
    """Whose day ε protects, as the controller reports it (older ones: a host's)."""
    if result.get("unit") == "job":
        return f"a job of up to {result.get('job_hosts')} hosts, any 24 hours"
    return "one host, any 24 hours"


def render_privacy(result: dict[str, Any]) -> str:
    head = fields([("mode", result["mode"]),
                   ("epsilon per pool per day", result["epsilon_per_day"]),
                   ("unit", _unit(result)),
                   ("release interval s", result["release_interval"]),
                   ("longest interval s (small pools)", result.get("max_release_interval",
                                                                  result["release_interval"])),
                   ("noise at most, share of a pool's GPUs", result.get("noise_share", 0)),
                   ("GPUs per host (sensitivity)", result["host_gpus"]),
                   ("releases refused (budget spent)", result["refused"])])
    if result["mode"] != "private":
        return head + "\nno differential privacy in this mode: nothing is spent"
    rows = [{"hosts": "-", "release_interval": result["release_interval"], **r,
             "host_noise_scale": "-" if r["host_noise_scale"] is None
             else r["host_noise_scale"], "next_release_in": "-" if r["next_release_in"] is None
             else r["next_release_in"]} for r in result["pools"]]
    return head + "\n\n" + table(rows, [
        ("pool", "POOL"), ("gpu_class", "CLASS"), ("spent_24h", "SPENT 24H"),
        ("budget", "BUDGET"), ("releases_24h", "RELEASES 24H"), ("hosts", "HOSTS"),
        ("release_interval", "EVERY S"), ("epsilon_per_release", "EPS/RELEASE"),
        ("gpu_noise_scale", "GPU NOISE"),
        ("host_noise_scale", "HOST NOISE"), ("next_release_in", "NEXT IN S"),
    ])


def render_job_findings(result: dict[str, Any]) -> str:
    """Findings in force (ranks with their hosts), then the recent history, newest last."""
    rows = [{**f, "ranks": ", ".join(f"{r['rank']}@{r['host']} ({r['process']}, "
                                     f"{r['collectives']})" for r in f["ranks"][:8])
             + (" ..." if len(f["ranks"]) > 8 else ""),
             "told": "yes" if f["tenant_told"] else "operators only"}
            for f in result.get("findings", [])]
    out = table(rows, [
        ("job", "JOB"), ("tenant", "TENANT"), ("comm", "COMM"), ("finding", "FINDING"),
        ("cause", "CAUSE"), ("at_collective", "AT"), ("ranks", "RANKS@HOSTS"),
        ("told", "TENANT TOLD")]) if rows else "no hang, stall or straggler in force"
    history = [{**h, "what": h.get("event", ""), "detail": _history_detail(h)}
               for h in result.get("history", [])[-20:]]
    if history:
        out += "\n\n" + table(history, [("at", "AT"), ("job", "JOB"), ("what", "WHAT"),
                                        ("detail", "DETAIL")])
    counters = result.get("counters", {})
    return out + "\n\n" + fields([
        ("communicators watched", result.get("communicators", 0)),
        ("application XIDs", json.dumps(result.get("application_xids", {}), sort_keys=True)),
        ("reports", json.dumps(counters, sort_keys=True))])


def _history_detail(entry: dict[str, Any]) -> str:
    if entry.get("event") == "xid":
        return (f"XID {entry['xid']} ({entry['fault']}) on {entry['host']}, ranks "
                f"{', '.join(entry['ranks']) or '-'}"
                + (", teardown" if entry.get("teardown") else ""))
    ranks = ", ".join(f"{r['rank']}@{r['host']}" for r in entry.get("ranks", [])[:8])
    return (f"{entry.get('state')} comm {entry.get('comm')} ({entry.get('cause')}) at "
            f"{entry.get('at_collective')}: {ranks}")


def render_holds(rows: list[dict[str, Any]] | dict[str, Any]) -> str:
    """``-C holds``: each hold, its window in UTC; ``holds cancel``: what ended."""
    if isinstance(rows, dict):
        return fields(rows.items())
    return table([{**r, "start": _utc(r["start"]), "end": _utc(r["end"]),
                   "expires_at": _utc(r["expires_at"])} for r in rows], [
        ("id", "ID"), ("pool", "POOL"), ("gpu_class", "CLASS"), ("count", "GPUS"),
        ("start", "START (UTC)"), ("end", "END (UTC)"), ("expires_at", "NO-SHOW AT (UTC)"),
    ])


def _utc(stamp: float) -> str:
    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M:%S")
