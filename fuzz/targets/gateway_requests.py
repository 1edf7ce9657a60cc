"""Raw bytes on the HTTP gateway's port: the real gateway (aiohttp's parser with our
limits, the connection guard, the middleware, every route) over a real socket, in
front of a real controller core and database. Each input is one connection that
sends the bytes and closes its side. Every answer must be HTTP with a status below
500, the connection must end (no hang), and nothing may be logged as an error (an
exception in a handler is logged by aiohttp before its 500)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tempfile
import time
from pathlib import Path

from common import OURS, atheris, run

with atheris.instrument_imports(include=OURS):
    from controller.config import ControllerConfig
    from controller.gateway.http import Gateway
    from controller.server import ControllerServer
    from harmonaize.config import parse

#: The token the seeds carry (``Authorization: Bearer TOKEN``), filed for tenant acme.
TOKEN_ID, SECRET = "0123456789abcdef", "A" * 43
TOKEN = f"hzt_{TOKEN_ID}_{SECRET}"
STATE = Path(os.environ.get("HZ_FUZZ_STATE") or tempfile.mkdtemp(prefix="hz-fuzz-gateway-"))
CFG = parse(ControllerConfig, {
    "controller": {"database": str(STATE / "controller.db"),
                   "admin_socket": str(STATE / "controller.sock"), "admin_group": ""},
    # keepalive: streams the fuzzer opened and left end soon (their writes fail).
    "gateway": {"listen": "127.0.0.1:1", "keepalive": 1.0, "header_timeout": 2.0,
                "body_timeout": 2.0},
    "auth": {"mode": "none"}})
#: Seconds an exchange may take before it counts as a hang.
HANG = 10.0


class Errors(logging.Handler):
    """Errors logged anywhere: each one is a finding."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(self.format(record))


ERRORS = Errors()
logging.basicConfig(level=logging.CRITICAL)
logging.getLogger().addHandler(ERRORS)
logging.getLogger().setLevel(logging.ERROR)

SERVER = ControllerServer(CFG)
with SERVER.store.db:
    SERVER.store.db.execute(
        "INSERT OR REPLACE INTO tokens (id, tenant, hash, created, expires, note) "
        "VALUES (?, 'acme', ?, 0, ?, 'fuzz')",
        (TOKEN_ID, hashlib.sha256(SECRET.encode()).digest(), time.time() + 86400 * 365))
LOOP = asyncio.new_event_loop()
GATEWAY = Gateway(CFG.gateway, SERVER, hwm=100)
SERVER.gateway = GATEWAY


async def start() -> int:
    await GATEWAY.start(port=0)
    return GATEWAY.port


PORT = LOOP.run_until_complete(start())


async def exchange(data: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", PORT)
    try:
        writer.write(data)
        writer.write_eof()
        return await reader.read()
    finally:
        writer.close()


def one(data: bytes) -> None:
    try:
        answer = LOOP.run_until_complete(asyncio.wait_for(exchange(data), HANG))
    except TimeoutError:
        raise AssertionError(f"no end to the exchange within {HANG} s") from None
    except ConnectionError:
        answer = b""  # reset by the server (a refusal with input left unread)
    if answer and not answer.startswith(b"HTTP/1."):
        raise AssertionError(f"not an HTTP answer: {answer[:80]!r}")
    for status in _statuses(answer):
        if status >= 500:
            raise AssertionError(f"status {status}: {answer[:300]!r}")
    if ERRORS.seen:
        seen, ERRORS.seen = ERRORS.seen, []
        raise AssertionError("logged as an error:\n" + "\n".join(seen)[:3000])


def _statuses(answer: bytes) -> list[int]:
    """The status of each answer in the bytes (pipelined requests get several)."""
    out = []
    for line in answer.split(b"\r\n"):
        if line.startswith(b"HTTP/1.") and len(line) >= 12 and line[9:12].isdigit():
            out.append(int(line[9:12]))
    return out


if __name__ == "__main__":
    run(one)
