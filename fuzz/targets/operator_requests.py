"""Operator requests on the controller's admin socket, through the real
command table: every line gets a reply, and no reply is an internal error."""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from pathlib import Path

from common import OURS, atheris, run

with atheris.instrument_imports(include=OURS):
    from controller.config import ControllerConfig
    from controller.server import ControllerServer
    from harmonaize.config import parse
    from harmonaize.opsocket import Access

logging.disable(logging.CRITICAL)  # refusals are logged: not findings
#: The controller's database lives where the campaign says (it removes it afterwards).
STATE = Path(os.environ.get("HZ_FUZZ_STATE") or tempfile.mkdtemp(prefix="hz-fuzz-operator-"))
CFG = parse(ControllerConfig, {
    "controller": {"database": str(STATE / "controller.db"),
                   "admin_socket": str(STATE / "controller.sock"), "admin_group": ""},
    "auth": {"mode": "none"}})
SERVER = ControllerServer(CFG)
LOOP = asyncio.new_event_loop()


def one(data: bytes) -> None:
    reply = LOOP.run_until_complete(SERVER.admin._dispatch(data, Access.ADMIN))
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise AssertionError(f"not a reply: {reply!r:.200}")
    if not reply["ok"] and str(reply.get("error", "")).startswith("internal error"):
        raise AssertionError(reply["error"])


if __name__ == "__main__":
    run(one)
