"""The gateway's sessions are not tokens: random ids that lapse, are bounded per tenant and end."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.gateway.sessions import Sessions
from tests.conftest import Spawn, needs_root
from tests.sse import CurlStream, curl
from tests.tenant.test_gateway_hostile import gateway
from tests.tenant.test_http import bearer, token

pytestmark = [pytest.mark.hardening, needs_root]


# --- item 7: sessions that are not tokens -----------------------------------------------


def test_item7_a_session_lapses_after_its_lifetime_and_one_tenant_cannot_crowd_others(
        ) -> None:
    sessions = Sessions(lifetime=60.0, per_tenant=2, total=3)
    first = sessions.start("acme", "hzt_a", now=100.0)
    assert first is not None and sessions.get(first, 159.0) is not None
    assert sessions.get(first, 160.0) is None and len(sessions) == 0
    held = [sessions.start(tenant, "t", now=200.0) for tenant in ("acme", "acme", "beta")]
    assert all(held) and sessions.start("gamma", "t", now=200.0) is None  # all taken
    assert sessions.start("acme", "t", now=201.0) is not None  # acme's oldest made room
    assert sessions.get(held[0], 201.0) is None and sessions.get(held[2], 201.0) is not None
    assert sessions.start("gamma", "t", now=261.0) is not None  # the lapsed are forgotten


def start_session(url: str, secret: str) -> tuple[str, str]:
    """(the cookie's value, the whole Set-Cookie header) of a new session."""
    status, body, headers = curl("POST", f"{url}/session", *bearer(secret))
    assert status == 200 and body["ok"], body
    cookie = headers["set-cookie"]
    match = re.match(r"hz_session=([^;]+)", cookie)
    assert match is not None, cookie
    return match[1], cookie


def feed_status(url: str, sid: str) -> int:
    status, _, _ = curl("GET", f"{url}/feed?topic=pool/", "--max-time", "5",
                        "-H", f"Cookie: hz_session={sid}")
    return status


def test_item7_the_session_cookie_is_a_random_id_not_the_token_and_no_bearer(
        spawn: Spawn, workdir: Path) -> None:
    controller, port = gateway(spawn, workdir)
    url = f"http://127.0.0.1:{port}/v1"
    secret = token(controller, "acme")
    sid, cookie = start_session(url, secret)
    assert sid != secret and secret not in cookie and sid.startswith("hzs_")
    flags = {part.strip().split("=")[0].lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "path", "samesite", "max-age"} <= flags
    assert "samesite=strict" in cookie.lower() and "secure" not in flags  # plain HTTP
    stream = CurlStream(spawn, f"{url}/feed?topic=pool/", "-H", f"Cookie: hz_session={sid}")
    assert stream.next().data["data"]["tenant"] == "acme"  # the cookie reads the feed
    stream.close()
    for path, method, body in (("declarations", "POST", {"job": "j"}),
                               ("notices", "GET", None), ("feed", "GET", None)):
        status, answer, _ = curl(method, f"{url}/{path}", *bearer(sid), body=body)
        assert status == 401 and answer["error"]["code"] == "not-authenticated", path
    # Nor is a token taken as a cookie.
    assert feed_status(url, secret) == 401


def test_item7_delete_session_ends_it_and_its_streams(spawn: Spawn, workdir: Path) -> None:
    controller, port = gateway(spawn, workdir)
    url = f"http://127.0.0.1:{port}/v1"
    sid, _ = start_session(url, token(controller, "acme"))
    stream = CurlStream(spawn, f"{url}/feed?topic=pool/", "-H", f"Cookie: hz_session={sid}")
    assert stream.next().kind == "subscribed"
    status, body, headers = curl("DELETE", f"{url}/session", "-H", f"Cookie: hz_session={sid}")
    assert status == 200 and body["ended"] is True
    assert "hz_session=\"\"" in headers["set-cookie"] or "max-age=0" in \
        headers["set-cookie"].lower()
    assert stream.proc.wait(timeout=30) == 0  # the server ended the open stream
    status, body, _ = curl("GET", f"{url}/feed?topic=pool/", "-H", f"Cookie: hz_session={sid}")
    assert status == 401 and "session is not valid" in body["error"]["message"]


def test_item7_sessions_per_tenant_are_bounded_and_end_with_their_token(
        spawn: Spawn, workdir: Path) -> None:
    controller, port = gateway(spawn, workdir, "sessions_per_tenant = 2\n")
    url = f"http://127.0.0.1:{port}/v1"
    secret = token(controller, "acme")
    first, second, third = (start_session(url, secret)[0] for _ in range(3))
    assert feed_status(url, first) == 401  # the oldest made room
    beta = start_session(url, token(controller, "beta"))[0]  # another tenant's own room
    for sid in (second, third, beta):
        stream = CurlStream(spawn, f"{url}/feed?topic=pool/", "-H", f"Cookie: hz_session={sid}")
        assert stream.next().kind == "subscribed"
        stream.close()
    listed = controller.request("tokens")
    acme = next(t["id"] for t in listed if t["tenant"] == "acme")
    controller.request("token-revoke", {"id": acme})
    assert feed_status(url, second) == 401 and feed_status(url, third) == 401
