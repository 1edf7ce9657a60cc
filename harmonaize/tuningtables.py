"""``harmonctl jobs`` and ``harmonctl policy JOB``: the agent's tuning, as tables."""

from __future__ import annotations

import time
from typing import Any

from harmonaize.tables import fields, table


def _when(stamp: float | None) -> str:
    return "-" if stamp is None else time.strftime("%H:%M:%S", time.localtime(stamp))


def render_jobs(result: dict[str, Any]) -> str:
    parts = [fields([
        ("links", f"{result.get('link_level')}: {result.get('evidence')}"),
        ("policies", result.get("policy_dir")),
    ])]
    rows = result.get("jobs", [])
    if rows:
        parts += ["", table([{**r, "wanted": r["wanted"] if r["wanted"] != r["choice"] else ""}
                             for r in rows], [
            ("job", "JOB"), ("revision", "REV"), ("ranges", "RANGES"), ("choice", "CHOICE"),
            ("wanted", "WANTED"), ("mode", "MODE"), ("communicators", "COMMS"),
            ("pending", "PENDING"), ("bulk_floor_mbps", "BULK FLOOR Mb/s"),
            ("reason", "REASON"), ("waiting", "WAITING"),
        ])]
        for r in rows:
            parts += [f"DIVERGED: job {r['job']} communicator {line}"
                      for line in r.get("diverged", [])]
    else:
        parts += ["", "no declared jobs"]
    htb = result.get("traffic_classes") or {}
    if htb.get("links"):
        parts += ["", "traffic classes: " + ", ".join(
            f"{name} {state}" for name, state in htb["links"].items())]
    parts += [f"note: {note}" for note in htb.get("notes", [])]
    if htb.get("error"):
        parts.append(f"traffic classes: {htb['error']}")
    if result.get("last_error"):
        parts.append(f"last error ({result.get('errors')} in all): {result['last_error']}")
    return "\n".join(parts)


def _rank_state(rank: dict[str, Any]) -> str:
    if rank.get("waiting_at") is not None:
        return f"waiting at {rank['waiting_at']}"
    if rank.get("refused") is not None:
        return f"refused rev {rank['refused']}"
    if rank.get("deferred"):
        return "deferred"
    return "" if rank.get("mapped") else "no policy mapped"


def render_policy(result: dict[str, Any]) -> str:
    declaration = result.get("declaration", {})
    bulk = declaration.get("bulk")
    parts = [fields([
        ("job", result.get("job")),
        ("revision", declaration.get("revision")),
        ("choice", result.get("choice")),
        ("reason", result.get("reason")),
        ("waiting", result.get("waiting") or "-"),
        ("mode", result.get("mode")),
        ("decision", result.get("decision")),
        ("cancelled", result.get("cancelled")),
        ("policy file", f"{result.get('policy_file')} (policy id {result.get('policy_id')})"),
        ("group", "-" if result.get("group") is None else result.get("group")),
        ("channels", result.get("channels")),
        ("rules digest", result.get("fingerprint")),
        ("bulk", "-" if not bulk else f"floor {bulk.get('floor_mbps')} Mb/s, ports "
         f"{bulk.get('ports') or '-'}, DSCP {bulk.get('dscp') or '-'}"),
    ])]
    ranges = [{**r, "collectives": ",".join(r["collectives"]),
               "algorithms": ",".join(r["algorithms"]), "protocols": ",".join(r["protocols"]),
               "bytes": f"{r['min_bytes']}..{r['max_bytes']}",
               "channels": f"{r['min_channels']}..{r['max_channels']}"}
              for r in declaration.get("tuning", [])]
    parts += ["", table(ranges, [
        ("collectives", "DECLARED COLLECTIVES"), ("algorithms", "ALGORITHMS"),
        ("protocols", "PROTOCOLS"), ("bytes", "BYTES"), ("channels", "CHANNELS"),
    ]) if ranges else "no tuning ranges declared: NCCL's own choices"]
    rules = [{"choice": c["name"], "collectives": ",".join(r["collectives"]),
              "bytes": f"{r['min_bytes']}..{r['max_bytes']}", "prefer": " ".join(r["prefer"]),
              "max_channels": r["max_channels"] or "-"}
             for c in result.get("choices", []) for r in c["rules"]]
    if rules:
        parts += ["", table(rules, [
            ("choice", "CHOICE"), ("collectives", "COLLECTIVES"), ("bytes", "BYTES"),
            ("prefer", "PREFER (ALGO/PROTO)"), ("max_channels", "MAX CHANNELS"),
        ])]
    parts += [f"note: {note}" for note in result.get("notes", [])]
    comms = result.get("communicators", [])
    if comms:
        parts += ["", table([{**c, "state": c.get("diverged") or c.get("waiting") or (
            "pending" if c.get("pending") else "")} for c in comms], [
            ("comm", "COMMUNICATOR"), ("ranks", "RANKS"), ("nodes", "NODES"),
            ("here", "HERE"), ("collectives", "COLLECTIVES"), ("per_second", "PER S"),
            ("revision", "REV"), ("before", "BEFORE"), ("at", "AT"), ("after", "AFTER"),
            ("passed", "PASSED"), ("state", "STATE"),
        ])]
    plugin = result.get("plugin", [])
    if plugin:
        parts += ["", table([{**p, "switch": p["last_switch"] if p["switches"] else "-",
                              "state": _rank_state(p)} for p in plugin], [
            ("pid", "PID"), ("comm", "COMMUNICATOR"), ("collectives", "COLLECTIVES"),
            ("revision", "REV"), ("switches", "SWITCHES"), ("switch", "LAST SWITCH"),
            ("nccl", "NCCL"), ("state", "STATE"),
        ])]
    if result.get("orphaned"):
        parts.append("following rules this agent could not rebuild (left as they are): "
                     + ", ".join(result["orphaned"]))
    if result.get("unlisted"):
        parts.append(f"left to NCCL (the policy holds 32 communicators): "
                     f"{', '.join(result['unlisted'])}")
    history = [{**h, "when": _when(h["time"]), "change": f"{h['from']} -> {h['to']}"}
               for h in result.get("history", [])]
    if history:
        parts += ["", table(history, [
            ("when", "WHEN"), ("step", "PASS"), ("kind", "KIND"), ("change", "CHANGE"),
            ("reason", "REASON"),
        ])]
    launch = result.get("next_launch", {})
    values = launch.get("values", {})
    parts += ["", f"next launch ({launch.get('file')}): "
              + (" ".join(f"{k}={v}" for k, v in sorted(values.items())) or "nothing to change")]
    return "\n".join(parts)
