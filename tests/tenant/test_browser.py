"""A real browser as a tenant's dashboard: headless Chromium runs a page whose
EventSource reads the HTTP gateway (a session cookie from a token, across origins the
provider allowed) and receives what FeedClient receives."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from harmonaize.schema import to_plain
from tests.conftest import free_port, needs_root
from tests.controller.test_feed import Sender, advice, place
from tests.daemons import FakeAgent, start_controller, tenant_feed
from tests.tenant.test_http import summary, token

pytestmark = [pytest.mark.tenant, needs_root,
              pytest.mark.skipif(not shutil.which("chromedriver"),
                                 reason="needs Debian's chromium-driver (scripts/setup "
                                 "installs it)")]

PAGE = Path(__file__).resolve().parents[1] / "clients" / "browser"



@pytest.fixture
def browser() -> Iterator[Any]:
    from selenium import webdriver  # noqa: PLC0415 - only this test drives a browser
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu",
                 "--disable-dev-shm-usage", "--no-first-run"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_eventsource_in_chromium_receives_what_feedclient_receives(
        spawn, workdir: Path, ctx: zmq.Context, browser: Any) -> None:
    port, page_port = free_port(), free_port()
    origin = f"http://127.0.0.1:{page_port}"
    controller = start_controller(spawn, workdir, f'[gateway]\nlisten = "127.0.0.1:{port}"\n'
                                  f'cors_origins = ["{origin}"]\n')
    spawn([sys.executable, "-m", "http.server", str(page_port), "--bind", "127.0.0.1",
           "--directory", str(PAGE)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    place(controller, "job-a", "acme", "h1", "h1")
    sender = Sender(FakeAgent(ctx, controller))
    sender.send(summary(0))
    topics = ["pool/", "job/acme/"]
    with tenant_feed(controller, topics, context=ctx) as feed:
        present = {}
        while len(present) < 2:
            message = feed.recv(timeout=20)
            assert message is not None
            present[(message.topic, message.seq)] = to_plain(message.body)
        fragment = (f"gateway=http://127.0.0.1:{port}/v1&token={token(controller, 'acme')}"
                    + "".join(f"&topic={t}" for t in topics))
        # The page server may take a moment to listen, and a refused page is an
        # exception in this chromedriver (an error page in others): wait for the port.
        deadline = time.monotonic() + 30
        while not listening(page_port) and time.monotonic() < deadline:
            time.sleep(0.1)
        browser.get(f"{origin}/feed.html#{fragment}")
        assert "feed" in browser.title, browser.title

        def received(count: int) -> list[dict[str, Any]]:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                got = browser.execute_script("return window.received")
                problems = browser.execute_script("return window.problems")
                assert not problems, problems
                if len(got) >= count:
                    return got
                time.sleep(0.1)
            raise AssertionError(f"the page received {len(got)} events, not {count}")

        first = received(3)  # subscribed, then the present
        assert first[0]["event"]["data"]["tenant"] == "acme"
        assert {(e["event"]["subject"], e["event"]["seq"]): e["event"]["data"]
                for e in first[1:3]} == present
        for in_use in (2, 8, 0):
            sender.send(summary(in_use))
            sender.send(advice("job-a", in_use % 2))
        live = {}
        while (message := feed.recv(timeout=2)) is not None:
            live[(message.topic, message.seq)] = to_plain(message.body)
        events = received(3 + len(live))[3:]
    assert len(live) >= 5
    assert {(e["event"]["subject"], e["event"]["seq"]): e["event"]["data"]
            for e in events} == live
    assert all(e["id"] for e in events)  # lastEventId: a cursor to resume from
