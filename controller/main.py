"""``harmonaize-controller``: the central service."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

from controller import config as controller_config
from controller.server import ControllerServer
from harmonaize import __version__, statemachine, wireaudit
from harmonaize.config import ConfigError
from harmonaize.logs import configure_logging


def main(argv: list[str] | None = None) -> int:
    wireaudit.install()  # only where HARMONAIZE_WIRE_AUDIT asks for it
    parser = argparse.ArgumentParser(
        prog="harmonaize-controller",
        description="HarmonAIze controller: ingests agents' aggregated events, keeps cluster "
        "state, and publishes redacted feeds to tenants.",
    )
    parser.add_argument(
        "-c", "--config", type=Path, default=None,
        help=f"configuration file (default {controller_config.DEFAULT_PATH}, optional)",
    )
    parser.add_argument(
        "--initialise", action="store_true",
        help="if the database is empty or unreadable, move it aside and begin a new one "
        "(tenants' clients see a new feed epoch); without it such a database stops the start",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    args = parser.parse_args(argv)
    try:
        cfg, path = controller_config.load(args.config)
    except ConfigError as exc:
        print(f"harmonaize-controller: {exc}", file=sys.stderr)
        return 2
    configure_logging(cfg.controller.log_level.value)
    # The suite runs daemons with illegal state moves raising; in production they are
    # counted and refused (harmonaize.statemachine).
    statemachine.set_strict(os.environ.get(statemachine.STRICT_ENV) == "1")
    try:
        if cfg.cluster.enabled:
            from controller.replica import ReplicaServer  # noqa: PLC0415 - needs nats-py

            server: ControllerServer = ReplicaServer(cfg, path, initialise=args.initialise)
        else:
            server = ControllerServer(cfg, path, initialise=args.initialise)
        return asyncio.run(server.run())
    except (RuntimeError, OSError) as exc:
        print(f"harmonaize-controller: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
