"""Logging set-up shared by the daemons."""

from __future__ import annotations

import logging
import os


def configure_logging(level: str) -> None:
    # Under systemd the journal adds its own timestamps.
    fmt = "%(levelname)s %(name)s: %(message)s"
    if not os.environ.get("JOURNAL_STREAM"):
        fmt = "%(asctime)s " + fmt
    logging.basicConfig(level=level.upper(), format=fmt, force=True)
