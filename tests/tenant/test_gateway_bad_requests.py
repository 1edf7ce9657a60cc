"""Deep bodies, huge cursors and malformed HTTP get a 400 in one line, never a traceback or 500."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from controller.gateway.events import MAX_EPOCH, MAX_OFFSET, Cursor, CursorError
from tests.conftest import Spawn, needs_root
from tests.sse import CurlStream, curl
from tests.tenant.test_gateway_hostile import connect, gateway, read_to_end, served, sockets
from tests.tenant.test_http import bearer, token

pytestmark = [pytest.mark.hardening, needs_root]

# The raw sockets' fixture, from the file of the connection tests: pytest finds a fixture
# by the module's names, hence the export.
__all__ = ["sockets"]


# --- item 8: no tracebacks or 500s from bodies and cursors ------------------------------


def test_item8_a_body_nested_100k_deep_is_a_400_in_one_line(spawn: Spawn,
                                                           workdir: Path) -> None:
    controller, port = gateway(spawn, workdir)
    url = f"http://127.0.0.1:{port}/v1"
    secret = token(controller, "acme")
    for body in ("[" * 100_000 + "]" * 100_000, '{"a":' * 40_000 + "1" + "}" * 40_000,
                 '{"job": ' + "[" * 40 + "]" * 40 + "}", '{"job": NaN}'):
        status, answer, _ = curl("POST", f"{url}/declarations", *bearer(secret), body=body)
        assert status == 400 and answer["error"]["code"] == "malformed", answer
        assert "\n" not in answer["error"]["message"]
    status, answer, _ = curl("POST", f"{url}/notices/n1", *bearer(secret),
                             body="[" * 100_000)
    assert status == 400 and "nested deeper" in answer["error"]["message"]
    assert served(port) == 200
    assert "Traceback" not in controller.log.read_text()


def test_item8_a_cursor_offset_of_2_63_or_more_is_a_400_not_a_dropped_stream(
        spawn: Spawn, workdir: Path) -> None:
    controller, port = gateway(spawn, workdir)
    url = f"http://127.0.0.1:{port}/v1"
    secret = token(controller, "acme")
    epoch = "1"  # the range is checked before the epoch is compared with the feed's
    for cursor in (f"{epoch}-{2**63}-0", f"{epoch}-0-{2**63}", f"{epoch}-9999999999999999999-0",
                   f"{epoch}-{MAX_OFFSET + 1}-0", f"{2**64 - 1:x}-0-0"):
        for header in (("-H", f"Last-Event-ID: {cursor}"), ()):
            where = f"{url}/feed?topic=pool/" + ("" if header else f"&since={cursor}")
            status, answer, _ = curl("GET", where, *bearer(secret), *header)
            assert status == 400 and answer["error"]["code"] == "invalid", (cursor, answer)
            assert "out of range" in answer["error"]["message"]
    stream = CurlStream(spawn, f"{url}/feed?topic=pool/&since=1-{MAX_OFFSET}-0",
                        *bearer(secret))
    assert stream.next().kind == "subscribed"  # the largest offset is still a cursor
    stream.close()
    assert "Traceback" not in controller.log.read_text()
    assert "OverflowError" not in controller.log.read_text()


def test_item8_malformed_http_and_cut_bodies_are_400s_without_a_traceback_stream(
        spawn: Spawn, workdir: Path, sockets: list[socket.socket]) -> None:
    controller, port = gateway(spawn, workdir)
    secret = token(controller, "acme").encode()
    for number in range(100):
        sock = connect(sockets, port, b"GET /v1/noti\x9d\x9a%d HTTP/1.1\r\nHost: h\r\n\r\n"
                       % number)
        assert re.match(rb"HTTP/1\.[01] 400 ", read_to_end(sock))
        sock.close()
    sockets.clear()
    cut = connect(sockets, port, b"POST /v1/declarations HTTP/1.1\r\nHost: h\r\n"
                  b"Authorization: Bearer " + secret + b"\r\nContent-Type: application/json"
                  b"\r\nContent-Length: 300\r\n\r\n{\"job\": ")
    cut.shutdown(socket.SHUT_WR)  # the body ends before its Content-Length
    read_to_end(cut)
    assert served(port) == 200
    assert controller.request("status")["gateway"]["malformed_http"] == 100
    text = controller.log.read_text()
    assert "Traceback" not in text and text.count("malformed HTTP from") == 1, text[-2000:]


@given(st.text(max_size=60) | st.from_regex(r"[0-9a-f]{1,17}-[0-9]{1,20}-[0-9]{1,20}",
                                            fullmatch=True))
@example(f"1-{2**63}-0")
@example(f"{2**63:x}-0-0")
def test_item8_a_cursor_parses_in_range_or_is_refused_in_one_line(text: str) -> None:
    try:
        cursor = Cursor.parse(text)
    except CursorError as exc:
        assert "\n" not in str(exc)
        return
    assert 0 <= cursor.epoch <= MAX_EPOCH
    assert 0 <= cursor.pool <= MAX_OFFSET and 0 <= cursor.job <= MAX_OFFSET
    assert Cursor.parse(str(cursor)) == cursor
