"""``harmonctl -C scheduler``: each node, our intent, the scheduler's state, and why an
intent waits (the breaker, an operator's cancel or pause, shadow mode)."""

from __future__ import annotations

import time
from typing import Any

from harmonaize.tables import fields, table

#: ``scheduler ACTION`` as admin commands.
SCHEDULER_COMMANDS = {"view": "scheduler", "cancel": "scheduler-cancel",
                      "release": "scheduler-release", "pause": "scheduler-pause",
                      "resume": "scheduler-resume"}


def render_scheduler(result: dict[str, Any]) -> str:
    if "nodes" not in result:  # an answer to cancel, release, pause or resume
        return fields(sorted(result.items()))
    read = result["last_read"]
    head = fields([
        ("mode", result["mode"] + (" (paused by an operator)" if result["paused"] else "")),
        ("breaker: max share of a partition out", f"{result['max_share']:.0%}"),
        ("cancelled nodes", ", ".join(result["cancelled"]) or "none"),
        ("last read", f"{time.time() - read:.0f} s ago" if read else "never"),
        ("last error", result["last_error"] or "none"),
        ("counters", ", ".join(f"{k} {v}" for k, v in sorted(result["counters"].items()))),
    ])
    rows = [{**row, "held": row["held"] or "-", "intent": row["intent"] or "-",
             "reason": row["reason"] or "-", "host": row["host"] or "-"}
            for row in result["nodes"]]
    return head + "\n\n" + table(rows, [
        ("node", "NODE"), ("host", "HOST"), ("slurm", "SLURM STATE"), ("reason", "REASON"),
        ("situation", "OURS?"), ("intent", "INTENT"), ("held", "HELD BY"),
    ])
