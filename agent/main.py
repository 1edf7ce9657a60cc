"""``harmonaize-agent``: the per-host daemon."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from agent import config as agent_config
from agent.daemon import AgentDaemon
from agent.observers import ObserverSet
from harmonaize import __version__, statemachine, wireaudit
from harmonaize.config import ConfigError
from harmonaize.logs import configure_logging


def _check(cfg: agent_config.AgentConfig, as_json: bool) -> int:
    """Start every observer (attach, open devices), report, stop, exit."""
    observers = ObserverSet.from_config(cfg)
    observers.start_all()
    try:
        records = [r.as_dict() for r in observers.records.values()]
    finally:
        observers.stop_all()
    if as_json:
        print(json.dumps({"observers": records}, indent=2))
    else:
        for r in records:
            print(f"{r['name']:<10} {r['state']:<8} {r['detail']}")
    return 1 if any(r["state"] == "failed" for r in records) else 0


def main(argv: list[str] | None = None) -> int:
    wireaudit.install()  # only where HARMONAIZE_WIRE_AUDIT asks for it
    parser = argparse.ArgumentParser(
        prog="harmonaize-agent",
        description="HarmonAIze host agent: observes links and GPUs, runs micro-level loops, "
        "publishes aggregated health to the controller.",
    )
    parser.add_argument(
        "-c", "--config", type=Path, default=None,
        help=f"configuration file (default {agent_config.DEFAULT_PATH}, optional)",
    )
    parser.add_argument("--check", action="store_true",
                        help="start every observer, report what works, and exit")
    parser.add_argument("--json", action="store_true", help="with --check: print JSON")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    args = parser.parse_args(argv)
    try:
        cfg, path = agent_config.load(args.config)
    except ConfigError as exc:
        print(f"harmonaize-agent: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.agent.log_level.value)
    # The suite runs daemons with illegal state moves raising; in production they are
    # counted and refused (harmonaize.statemachine).
    statemachine.set_strict(os.environ.get(statemachine.STRICT_ENV) == "1")
    if args.check:
        return _check(cfg, args.json)
    try:
        return asyncio.run(AgentDaemon(cfg, path).run())
    except RuntimeError as exc:  # e.g. the socket is already served
        print(f"harmonaize-agent: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
