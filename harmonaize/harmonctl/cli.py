"""harmonctl's main: parse, answer local commands (keygen, completion, watch), or call
the daemon and print its answer as a table (or JSON).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from harmonaize import keys
from harmonaize.energytables import render_energy
from harmonaize.harmonctl.agent import (
    render_agent_status,
    render_gpus,
    render_health,
    render_links,
    render_remediation,
    render_validations,
)
from harmonaize.harmonctl.calls import Failure, args_for, call, daemon_command
from harmonaize.harmonctl.controller import (
    render_capacity,
    render_controller_status,
    render_events,
    render_feed,
    render_holds,
    render_hosts,
    render_job_findings,
    render_placements,
    render_pools,
    render_privacy,
    render_tenants,
)
from harmonaize.harmonctl.parser import (
    build_parser,
    completion_script,
    normalize,
)
from harmonaize.jobhealthtables import render_job_health
from harmonaize.rdmatables import render_rdma
from harmonaize.schedulertables import render_scheduler
from harmonaize.tables import fields, table
from harmonaize.tuningtables import render_jobs, render_policy


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
    "status": render_agent_status,
    "links": render_links,
    "rdma": render_rdma,
    "gpus": render_gpus,
    "health": render_health,
    "energy": render_energy,
    "job-health": render_job_health,
    "validations": render_validations,
    "remediation": render_remediation,
    "jobs": render_jobs,
    "policy": render_policy,
    "help": _render_help,
}


CONTROLLER_RENDERERS: dict[str, Renderer] = {
    "status": render_controller_status,
    "hosts": render_hosts,
    "capacity": render_capacity,
    "events": render_events,
    "jobs": render_placements,
    "feed": render_feed,
    "tenants": render_tenants,
    "pools": render_pools,
    "privacy": render_privacy,
    "job-findings": render_job_findings,
    "holds": render_holds,
    "scheduler": render_scheduler,
    "scheduler-cancel": render_scheduler,
    "scheduler-release": render_scheduler,
    "scheduler-pause": render_scheduler,
    "scheduler-resume": render_scheduler,
    "help": _render_help,
}


def render(ns: argparse.Namespace, command: str, result: Any) -> str:
    renderers = CONTROLLER_RENDERERS if ns.controller else AGENT_RENDERERS
    return renderers.get(command, _render_simple)(result)


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


def main(argv: list[str] | None = None) -> int:
    argv = normalize(sys.argv[1:] if argv is None else argv)
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
        result = call(ns, daemon_command(ns), args_for(ns))
    except Failure as exc:
        print(f"harmonctl: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(render(ns, daemon_command(ns), result))
    return 0
