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


def one_line(exc: BaseException) -> str:
    """An error in one line for an operator: an OSError's own words and file, else its text."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
