"""The HTTP gateway under outside attack (issue 28, items 3, 7 and 8), against a real
controller over real sockets: idle and half-open connections closed, caps per address
and over all, descriptor exhaustion met with one line and a counter, sessions that are
not tokens, and bodies and cursors refused in one line instead of a traceback."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import re
import resource
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from harmonaize.exhaustion import AcceptExhaustion
from tests.conftest import Spawn, free_port, needs_root
from tests.controller.test_feed import Sender
from tests.daemons import Controller, FakeAgent, start_controller, tenant_feed, wait_until
from tests.sse import CurlStream, curl
from tests.tenant.test_http import bearer, certificate, summary, token

pytestmark = [pytest.mark.hardening, needs_root]


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    """Raw client sockets, closed at teardown whatever happened."""
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def gateway(spawn: Spawn, workdir: Path, extra: str = "",
            sections: str = "") -> tuple[Controller, int]:
    port = free_port()
    controller = start_controller(
        spawn, workdir, f'[gateway]\nlisten = "127.0.0.1:{port}"\n{extra}{sections}')
    return controller, port


def connect(held: list[socket.socket], port: int, data: bytes = b"",
            source: str = "127.0.0.1", timeout: float = 60) -> socket.socket:
    """``timeout``: far beyond every deadline under test, so that a hang fails the test."""
    sock = socket.socket()
    held.append(sock)
    sock.bind((source, 0))
    sock.settimeout(timeout)
    sock.connect(("127.0.0.1", port))
    if data:
        sock.sendall(data)
    return sock


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (a reset counts as
    closed); a server that keeps it open makes this time out and the test fail."""
    out = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            out += chunk
    return out


def served(port: int) -> int:
    status, _, _ = curl("GET", f"http://127.0.0.1:{port}/v1/spec")
    return status


# --- item 3: idle and half-open connections, caps, descriptor exhaustion ---------------


def test_item3_idle_half_line_and_unfinished_header_connections_are_closed(
        spawn: Spawn, workdir: Path, sockets: list[socket.socket]) -> None:
    controller, port = gateway(spawn, workdir,
                               "header_timeout = 1.0\nidle_timeout = 2.0\nbody_timeout = 1.0\n")
    silent = connect(sockets, port)
    half_line = connect(sockets, port, b"GET /v1/sp")
    half_headers = connect(sockets, port, b"GET /v1/spec HTTP/1.1\r\nHost: x\r\nAccept: ")
    assert served(port) == 200  # a normal client is served meanwhile
    for sock in (silent, half_line, half_headers):
        assert read_to_end(sock) == b""  # closed by the server, without an answer
    # A kept-alive connection that goes quiet after an answer is closed too.
    kept = connect(sockets, port, b"GET /v1/spec HTTP/1.1\r\nHost: x\r\n\r\n")
    assert read_to_end(kept).startswith(b"HTTP/1.1 200")
    # A body that never arrives in full: answered 408, and the connection closed.
    slow_body = connect(sockets, port, b"POST /v1/declarations HTTP/1.1\r\nHost: x\r\n"
                        b"Content-Type: application/json\r\nContent-Length: 100\r\n"
                        b"Authorization: Bearer " + token(controller, "acme").encode() +
                        b"\r\n\r\n{\"job\"")
    answer = read_to_end(slow_body)
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer
    view = controller.request("status")["gateway"]
    assert view["header_timeouts"] == 3 and view["body_timeouts"] == 1
    assert served(port) == 200
    assert "Traceback" not in controller.log.read_text()


def test_item3_connections_over_the_per_address_and_global_caps_are_refused_at_accept(
        spawn: Spawn, workdir: Path, sockets: list[socket.socket]) -> None:
    controller, port = gateway(spawn, workdir, "header_timeout = 60.0\nmax_connections = 6\n"
                               "connections_per_address = 4\n")
    first = [connect(sockets, port) for _ in range(4)]
    wait_until(lambda: controller.request("status")["gateway"]["connections"] == 4,
               what="four connections held")
    over = connect(sockets, port)
    answer = read_to_end(over)
    assert answer.startswith(b"HTTP/1.1 503") and b"from your address" in answer
    # Another address still gets in, up to the cap over all.
    others = [connect(sockets, port, source="127.0.0.2") for _ in range(2)]
    wait_until(lambda: controller.request("status")["gateway"]["connections"] == 6,
               what="six connections held")
    answer = read_to_end(connect(sockets, port, source="127.0.0.3"))
    assert answer.startswith(b"HTTP/1.1 503") and b"6 in all" in answer
    refused = controller.request("status")["gateway"]["connections_refused"]
    assert refused == {"per_address": 1, "all_taken": 1}
    for sock in first + others:
        sock.close()
    wait_until(lambda: controller.request("status")["gateway"]["connections"] == 0,
               what="the held connections released")
    assert served(port) == 200


def limit_descriptors(count: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


def test_item3_descriptor_exhaustion_is_one_line_a_counter_and_then_recovered(
        spawn: Spawn, workdir: Path, sockets: list[socket.socket],
        ctx: zmq.Context) -> None:
    metrics = free_port()

    def limited(argv: list[str], **kwargs: object) -> object:
        return spawn(argv, preexec_fn=lambda: limit_descriptors(160), **kwargs)

    controller, port = gateway(limited, workdir,  # type: ignore[arg-type]
                               "header_timeout = 300.0\nconnections_per_address = 100000\n",
                               f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    # Hold connections until the controller can accept no more: the rest wait in the
    # listen backlog, and once that is full the kernel stops answering (a connect times
    # out); the controller may still be catching up, so this goes on until it says so.
    def exhausted() -> bool:
        if len(sockets) < 2000:
            with contextlib.suppress(OSError):
                connect(sockets, port, timeout=0.5)
        return "out of descriptors" in controller.log.read_text()

    wait_until(exhausted, 120, "the controller to run out of descriptors")
    time.sleep(3)  # asyncio retries accepting each second: the line must not repeat
    for sock in sockets:
        sock.close()
    wait_until(lambda: controller.request("status"), 60, "the admin socket to answer again")
    text = controller.log.read_text()
    assert text.count("out of descriptors") == 1, text[-3000:]
    assert "Traceback" not in text and text.count("Too many open files") == 1
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=30)
    values = dict(re.findall(r"^(harmonaize_controller_accept_exhausted\w*) (\S+)$",
                             scraped.read().decode(), re.M))
    assert float(values["harmonaize_controller_accept_exhausted_total"]) >= 2
    assert float(values["harmonaize_controller_accept_exhausted_episodes_total"]) == 1
    # Everyone is served again: an agent's hello, both tenant transports, root's status.
    sender = Sender(FakeAgent(ctx, controller))
    stream = CurlStream(spawn, f"http://127.0.0.1:{port}/v1/feed?topic=pool/",
                        *bearer(token(controller, "acme")))
    assert stream.next().kind == "subscribed"
    with tenant_feed(controller, ["pool/"], context=ctx) as feed:
        sender.send(summary(1))
        assert feed.recv(timeout=30) is not None
    stream.close()
    assert controller.request("status")["gateway"]["connections"] <= 1


def test_item3_exhaustion_is_one_line_per_episode_and_other_errors_pass_through(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    handler = AcceptExhaustion(quiet=30.0, clock=lambda: now[0])
    loop = asyncio.new_event_loop()
    passed: list[dict[str, object]] = []
    try:
        loop.set_exception_handler(lambda _loop, context: passed.append(context))
        handler.install(loop)
        out_of_files = OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        for second in (0.0, 1.0, 2.0, 31.0, 60.0, 100.0):  # 100: 40 s after the last
            now[0] = second
            loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                         "exception": out_of_files})
        other = {"message": "something else", "exception": OSError(errno.EMFILE, "x")}
        loop.call_exception_handler(other)
    finally:
        loop.close()
    assert (handler.failures, handler.episodes) == (6, 2)
    assert passed == [other]  # not an accept: the handler that was there has it
    lines = [r for r in caplog.records if "out of descriptors" in r.getMessage()]
    assert len(lines) == 2 and all(r.exc_info is None for r in lines)


def test_item3_tls_handshakes_count_against_the_caps_and_end_at_the_deadline(
        spawn: Spawn, workdir: Path, sockets: list[socket.socket]) -> None:
    pki = workdir / "pki"
    pki.mkdir()
    certificate(pki, "ca", None, "/CN=provider tenants CA")
    key, cert = certificate(pki, "server", "ca", "/CN=127.0.0.1",
                            "subjectAltName=IP:127.0.0.1\n")
    controller, port = gateway(spawn, workdir, f'tls_cert = "{cert}"\ntls_key = "{key}"\n'
                               "header_timeout = 1.0\nconnections_per_address = 3\n")
    silent = [connect(sockets, port) for _ in range(3)]  # TCP only: no handshake begun
    wait_until(lambda: controller.request("status")["gateway"]["connections"] == 3,
               what="three connections held before any handshake")
    assert read_to_end(connect(sockets, port)) == b""  # refused as accepted, no plain text
    assert controller.request("status")["gateway"]["connections_refused"]["per_address"] == 1
    for sock in silent:
        assert read_to_end(sock) == b""  # closed at the deadline, handshake or not
    wait_until(lambda: controller.request("status")["gateway"]["connections"] == 0,
               what="the silent connections released")
    # A real client is served, and over TLS the session cookie is Secure (item 7).
    tls = ("--cacert", str(pki / "ca.pem"))
    status, body, headers = curl("POST", f"https://127.0.0.1:{port}/v1/session", *tls,
                                 *bearer(token(controller, "acme")))
    assert status == 200 and body["tenant"] == "acme"
    flags = {part.strip().lower() for part in headers["set-cookie"].split(";")[1:]}
    assert {"secure", "httponly", "samesite=strict"} <= flags


def test_item3_the_metrics_listener_closes_idle_and_half_sent_requests_too(
        spawn: Spawn, workdir: Path, sockets: list[socket.socket]) -> None:
    metrics = free_port()
    gateway(spawn, workdir, sections=f'[metrics]\nlisten = "127.0.0.1:{metrics}"\n')
    idle = connect(sockets, metrics)
    half = connect(sockets, metrics, b"GET /metr")
    scraped = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=30)
    assert b"harmonaize_controller_gateway_connections" in scraped.read()
    for sock in (idle, half):
        assert read_to_end(sock).startswith(b"HTTP/1.1 408")  # answered, then closed
