"""The HTTP gateway with curl, against a real controller: the same feed as the ZeroMQ
one (topics, numbers, bodies, access control), resumed from a cursor, requests with
their codes and request ids, tokens, sessions and client certificates."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import zmq

from controller.config import GatewaySection
from controller.gateway.http import Gateway
from controller.gateway.streaming import Stream
from controller.gateway.tokens import Tokens
from controller.outputs import Delivery, FanOut, SendToTenant
from controller.store import Store
from harmonaize import messages as m
from harmonaize.schema import to_plain
from tests.conftest import Spawn, free_port, needs_root, python
from tests.controller.test_feed import Sender, advice, place
from tests.daemons import Controller, FakeAgent, start_controller, tenant_feed
from tests.sse import CurlStream, curl

pytestmark = [pytest.mark.tenant, needs_root]



def gateway(spawn: Spawn, workdir: Path, extra: str = "") -> tuple[Controller, str]:
    port = free_port()
    controller = start_controller(spawn, workdir,
                                  f'[gateway]\nlisten = "127.0.0.1:{port}"\n' + extra)
    return controller, f"http://127.0.0.1:{port}/v1"


def token(controller: Controller, tenant: str) -> str:
    return controller.request("token-issue", {"tenant": tenant, "days": 1})["token"]


def bearer(value: str) -> tuple[str, str]:
    return "-H", f"Authorization: Bearer {value}"


def summary(in_use: int) -> m.HostSummary:
    return m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8, in_use=in_use))


def test_curl_and_the_zeromq_client_see_the_same_feed(spawn, workdir: Path,
                                                      ctx: zmq.Context) -> None:
    controller, url = gateway(spawn, workdir)
    place(controller, "job-a", "acme", "h1", "h1")
    sender = Sender(FakeAgent(ctx, controller))
    sender.send(summary(0))
    topics = ["pool/", "job/acme/"]
    with tenant_feed(controller, topics, context=ctx) as feed:
        present = {}
        while len(present) < 2:  # the pool's capacity and the job's health, now
            message = feed.recv(timeout=20)
            assert message is not None, "no present from the ZeroMQ feed"
            present[(message.topic, message.seq)] = to_plain(message.body)
        stream = CurlStream(spawn, f"{url}/feed?topic=pool/&topic=job/acme/",
                            *bearer(token(controller, "acme")))
        subscribed = stream.next()
        assert subscribed.kind == "subscribed" and subscribed.id is None
        assert subscribed.data["data"]["tenant"] == "acme"
        assert subscribed.data["data"]["accepted"] == topics
        assert {e.key: e.data["data"] for e in stream.take(2)} == present
        for in_use in (2, 8, 4, 0):
            sender.send(summary(in_use))
            sender.send(advice("job-a", in_use % 3))
        live = {}
        while (message := feed.recv(timeout=2)) is not None:  # until the feed is quiet
            live[(message.topic, message.seq)] = to_plain(message.body)
        events = stream.take(len(live))
        stream.close()
    assert len(live) >= 7  # four advisories, and capacity as its bucket moved
    assert {e.key: e.data["data"] for e in events} == live  # the same numbers and bodies
    assert all(e.id for e in events)
    kinds = {e.kind for e in events}
    assert kinds == {"pool-capacity", "job-advisory"}
    assert {e.data["category"] for e in events} == {"condition", "event"}


def test_a_stream_resumes_from_its_cursor_with_nothing_missed_or_twice(
        spawn, workdir: Path, ctx: zmq.Context) -> None:
    controller, url = gateway(spawn, workdir)
    place(controller, "job-a", "acme", *["h1"] * 6)  # ranks 0-5
    sender = Sender(FakeAgent(ctx, controller))
    secret = token(controller, "acme")
    stream = CurlStream(spawn, f"{url}/feed?topic=job/acme/", *bearer(secret))
    stream.next()  # subscribed
    assert stream.next().kind == "job-health"  # the present
    for rank in range(3):
        sender.send(advice("job-a", rank))
    first = stream.take(3)
    assert [e.data["data"]["ranks"] for e in first] == [["0"], ["1"], ["2"]]
    cursor = first[1].id  # as if the connection broke after the second
    stream.close()
    for rank in range(3, 5):
        sender.send(advice("job-a", rank))
    resumed = CurlStream(spawn, f"{url}/feed?topic=job/acme/", *bearer(secret),
                         "-H", f"Last-Event-ID: {cursor}")
    resumed.next()
    again = resumed.take(3)
    assert [e.data["data"]["ranks"] for e in again] == [["2"], ["3"], ["4"]]
    assert [e.key[1] for e in again] == [first[2].key[1], first[2].key[1] + 1,
                                         first[2].key[1] + 2]
    sender.send(advice("job-a", 5))
    assert resumed.next().data["data"]["ranks"] == ["5"]  # then live, in order
    resumed.close()
    # The same with ?since= (a client's first connection), and a cursor of another epoch
    # gets everything retained.
    since = CurlStream(spawn, f"{url}/feed?topic=job/acme/&since={again[-1].id}",
                       *bearer(secret))
    since.next()
    epoch = again[-1].id.split("-")[0]
    other = CurlStream(spawn, f"{url}/feed?topic=job/acme/&since={int(epoch, 16) ^ 1:x}-0-0",
                       *bearer(secret))
    other.next()
    retained = [other.next()]  # everything retained, from the job's first message on
    while sum(e.kind == "job-advisory" for e in retained) < 6:
        retained.append(other.next())
    assert retained[0].key[1] == 1 and retained[0].kind == "job-health"
    assert [e.data["data"]["ranks"] for e in retained if e.kind == "job-advisory"] == [
        [str(r)] for r in range(6)]
    assert [e.key[1] for e in retained] == list(range(1, len(retained) + 1))
    assert since.next().data["data"]["ranks"] == ["5"]
    since.close()
    other.close()


def test_access_control_and_refusals_are_the_zeromq_feeds(spawn, workdir: Path,
                                                           ctx: zmq.Context) -> None:
    controller, url = gateway(spawn, workdir)
    place(controller, "job-a", "acme", "h1")
    sender = Sender(FakeAgent(ctx, controller))
    beta = token(controller, "beta")
    status, body, _ = curl("GET", f"{url}/feed?topic=job/acme/", *bearer(beta))
    assert status == 403 and body["error"]["code"] == "not-your-job"
    assert body["error"]["refused"] == [{"topic": "job/acme/", "reason": "not your job",
                                         "code": "not-your-job"}]
    status, body, headers = curl("GET", f"{url}/feed")
    assert status == 401 and body["error"]["code"] == "not-authenticated"
    assert headers["www-authenticate"].startswith("Bearer")
    status, body, _ = curl("GET", f"{url}/feed", *bearer("hzt_0123456789abcdef_" + "x" * 43))
    assert status == 401 and "not valid" in body["error"]["message"]
    status, body, _ = curl("GET", f"{url}/feed?since=nonsense", *bearer(beta))
    assert status == 400 and body["error"]["code"] == "invalid"
    # A mixed subscription: pool/ accepted, acme's refused, and nothing of acme's arrives.
    stream = CurlStream(spawn, f"{url}/feed?topic=pool/&topic=job/acme/&topic=job/",
                        *bearer(beta))
    answer = stream.next().data["data"]
    assert answer["accepted"] == ["pool/"] and [r["code"] for r in answer["refused"]] == [
        "not-your-job", "too-broad"]
    sender.send(advice("job-a", 0))
    sender.send(summary(3))
    assert stream.next().data["subject"].startswith("pool/")
    stream.close()
    status, body, _ = curl("GET", f"{url}/nothing", *bearer(beta))
    assert status == 404 and body["error"]["code"] == "not-found"


def test_declarations_and_their_refusals_name_the_field_and_the_request(
        spawn, workdir: Path) -> None:
    controller, url = gateway(spawn, workdir)
    place(controller, "job-a", "acme", "h1")
    acme = token(controller, "acme")
    rid = ("-H", "X-Request-Id: req-42")
    status, body, headers = curl("POST", f"{url}/declarations", *bearer(acme), *rid,
                                 body={"job": "job-a", "revision": 2,
                                       "max_validation_pause": 60})
    assert (status, body) == (200, {"ok": True, "request_id": "req-42"})
    assert headers["x-request-id"] == "req-42"
    status, body, _ = curl("POST", f"{url}/declarations", *bearer(acme), *rid,
                           body={"job": "job-a", "max_validation_paus": 60})
    assert status == 400 and body["request_id"] == "req-42"
    assert body["error"] == {"code": "invalid",
                             "message": "rejected: job-declaration.max_validation_paus: "
                                        "unknown key",
                             "field": "job-declaration.max_validation_paus"}
    status, body, _ = curl("POST", f"{url}/declarations", *bearer(acme),
                           body={"job": "job-a", "revision": 1})
    assert status == 409 and body["error"]["code"] == "stale-revision"
    status, body, _ = curl("POST", f"{url}/declarations", *bearer(acme),
                           body={"job": "job-z"})
    assert status == 404 and body["error"]["code"] == "not-placed"
    assert body["request_id"]  # one was made
    status, body, _ = curl("POST", f"{url}/declarations", *bearer(acme), body="{nope")
    assert status == 400 and body["error"]["code"] == "malformed"
    status, body, _ = curl("POST", f"{url}/declarations", *bearer(acme),
                           body="x" * (m.MAX_FRAME + 10))
    assert status == 413 and body["error"]["code"] == "malformed"
    status, body, _ = curl("POST", f"{url}/declarations", body={"job": "job-a"})
    assert status == 401
    # The declaration is the controller's, and reaches the host like one over ZeroMQ.
    (acme_row,) = [t for t in controller.request("tenants") if t["tenant"] == "acme"]
    assert acme_row["declared"] == ["job-a"]


def test_tokens_are_issued_listed_and_revoked(spawn, workdir: Path) -> None:
    controller, url = gateway(spawn, workdir)
    issued = controller.request("token-issue", {"tenant": "acme", "days": 1, "note": "ci"})
    assert issued["token"].startswith("hzt_") and issued["tenant"] == "acme"
    listed = controller.request("tokens")
    assert [t["id"] for t in listed] == [issued["id"]] and "token" not in listed[0]
    assert listed[0]["state"] == "valid" and listed[0]["note"] == "ci"
    status, _, _ = curl("GET", f"{url}/notices", *bearer(issued["token"]))
    assert status == 200
    stream = CurlStream(spawn, f"{url}/feed", *bearer(issued["token"]))
    assert stream.next().kind == "subscribed"
    assert controller.request("token-revoke", {"id": issued["id"]})["streams_ended"] == 1
    assert stream.proc.wait(timeout=30) == 0  # the stream it opened ended with it
    status, body, _ = curl("GET", f"{url}/notices", *bearer(issued["token"]))
    assert status == 401 and body["error"]["code"] == "not-authenticated"
    assert controller.request("tokens")[0]["state"] == "revoked"
    result = subprocess.run(python("harmonaize.harmonctl", "-C", str(controller.admin),
                                   "token", "issue", "--tenant", "beta", "--days", "2"),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert "hzt_" in result.stdout


def test_notices_are_listed_and_answered_over_http(spawn, workdir: Path,
                                                   ctx: zmq.Context) -> None:
    controller, url = gateway(spawn, workdir)
    place(controller, "job-a", "acme", "h1")
    acme = token(controller, "acme")
    status, _, _ = curl("POST", f"{url}/declarations", *bearer(acme),
                        body={"job": "job-a", "revision": 1, "max_validation_pause": 600,
                              "max_validation_defer": 300})
    assert status == 200
    agent = FakeAgent(ctx, controller)
    sender = Sender(agent)
    stream = CurlStream(spawn, f"{url}/feed?topic=job/acme/", *bearer(acme))
    stream.next()
    starts = time.time() + 900
    sender.send(m.ValidationNotice("job-a", ("0",), 600, starts, "plan-1", starts))
    told = next(e for e in iter(stream.next, None) if e.kind == "validation-notice")
    notice = told.data["data"]
    assert notice["id"].startswith("vn-") and notice["defer_seconds"] == 300
    status, body, _ = curl("GET", f"{url}/notices", *bearer(acme))
    assert status == 200 and [n["id"] for n in body["notices"]] == [notice["id"]]
    status, body, _ = curl("POST", f"{url}/notices/{notice['id']}", *bearer(acme),
                           body={"action": "defer", "seconds": 120})
    assert status == 200 and body["ok"]
    decision = agent.recv()
    while not isinstance(decision, m.ValidationDecision):
        decision = agent.recv()
    assert decision == m.ValidationDecision("plan-1", "job-a", defer=120.0)
    status, body, _ = curl("POST", f"{url}/notices/{notice['id']}", *bearer(acme),
                           body={"action": "defer"})
    assert status == 409 and body["error"]["code"] == "not-deferrable"
    status, body, _ = curl("POST", f"{url}/notices/{notice['id']}", *bearer(acme),
                           body={"action": "later"})
    assert status == 400 and body["error"]["field"] == "validation-answer.action"
    beta = token(controller, "beta")
    status, body, _ = curl("POST", f"{url}/notices/{notice['id']}", *bearer(beta),
                           body={"action": "approve"})
    assert status == 404 and body["error"]["code"] == "no-such-notice"
    stream.close()


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def certificate(directory: Path, name: str, ca: str | None, subject: str,
                extensions: str = "") -> tuple[Path, Path]:
    """A key and a certificate for ``subject``, signed by the CA named ``ca`` (None: a CA
    of its own)."""
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
            "-out", str(key))
    if ca is None:
        openssl("req", "-x509", "-new", "-key", str(key), "-subj", subject, "-days", "2",
                "-out", str(cert))
        return key, cert
    request = directory / f"{name}.csr"
    openssl("req", "-new", "-key", str(key), "-subj", subject, "-out", str(request))
    ext = directory / f"{name}.ext"
    ext.write_text(extensions or "basicConstraints=CA:FALSE\n")
    openssl("x509", "-req", "-in", str(request), "-CA", str(directory / f"{ca}.pem"),
            "-CAkey", str(directory / f"{ca}.key"), "-CAcreateserial", "-days", "2",
            "-extfile", str(ext), "-out", str(cert))
    return key, cert


def test_client_certificates_name_the_tenant(spawn, workdir: Path, ctx: zmq.Context) -> None:
    pki = workdir / "pki"
    pki.mkdir()
    certificate(pki, "ca", None, "/CN=provider tenants CA")
    certificate(pki, "rogue", None, "/CN=someone else's CA")
    server_key, server_cert = certificate(
        pki, "server", "ca", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1\n")
    acme_key, acme_cert = certificate(pki, "acme", "ca", "/CN=acme")
    fake_key, fake_cert = certificate(pki, "fake", "rogue", "/CN=acme")
    port = free_port()
    controller = start_controller(spawn, workdir, (
        f'[gateway]\nlisten = "127.0.0.1:{port}"\ntls_cert = "{server_cert}"\n'
        f'tls_key = "{server_key}"\nclient_ca = "{pki / "ca.pem"}"\n'))
    url = f"https://127.0.0.1:{port}/v1"
    place(controller, "job-a", "acme", "h1")
    Sender(FakeAgent(ctx, controller))
    tls = ("--cacert", str(pki / "ca.pem"))
    mine = ("--cert", str(acme_cert), "--key", str(acme_key))
    status, body, _ = curl("POST", f"{url}/declarations", *tls, *mine,
                           body={"job": "job-a", "revision": 1})
    assert (status, body["ok"]) == (200, True)  # the certificate's CN is the tenant
    stream = CurlStream(spawn, f"{url}/feed?topic=job/acme/", *tls, *mine)
    assert stream.next().data["data"]["tenant"] == "acme"
    assert stream.next().kind == "job-health"
    stream.close()
    # A certificate from another CA: refused in the TLS handshake, nothing gets through.
    rogue = subprocess.run(["curl", "-sS", "-X", "POST", f"{url}/declarations", *tls,
                            "--cert", str(fake_cert), "--key", str(fake_key), "-H",
                            "Content-Type: application/json", "--data-binary",
                            '{"job": "job-a", "revision": 2}'],
                           capture_output=True, text=True, timeout=30)
    assert rogue.returncode != 0 and not rogue.stdout
    # No certificate and no token: only refusals (a token would still do).
    status, body, _ = curl("GET", f"{url}/notices", *tls)
    assert status == 401 and body["error"]["code"] == "not-authenticated"
    status, body, _ = curl("GET", f"{url}/notices", *tls, *bearer(token(controller, "acme")))
    assert status == 200 and body["notices"] == []


def test_a_stream_too_far_behind_ends_after_what_it_queued(tmp_path: Path) -> None:
    """Without sockets: the gateway's queue per stream is the feed's send_hwm; a stream
    that falls behind it is ended (after what is queued) so its client resumes."""
    class Shell:
        store = Store(tmp_path / "c.db")
        tokens = Tokens(store.db)

    gateway = Gateway(GatewaySection(listen="127.0.0.1:1"), Shell(), hwm=2)  # type: ignore[arg-type]
    stream = Stream(b"hs1", "acme", ("pool/",))
    gateway.streams[stream.peer] = stream
    sends = [SendToTenant(b"hs1", "pool/p/H200", b"f", offset) for offset in (1, 2, 3)]
    assert [gateway.deliver(s) for s in sends] == [Delivery.SENT, Delivery.SENT, Delivery.FULL]
    assert stream.ending == "behind" and [s.offset for s in stream.pending] == [1, 2]
    assert gateway.deliver(SendToTenant(b"hs1", "pool/p/H200", b"f")) is Delivery.SENT  # again
    assert gateway.deliver(SendToTenant(b"hs9", "pool/p/H200", b"f", 4)) is Delivery.GONE
    # A fan-out: queued for the streams with room, the others named full or gone.
    other = Stream(b"hs2", "acme", ("pool/",))
    gateway.streams[other.peer] = other
    full: list[bytes] = []
    gone: list[bytes] = []
    gateway.deliver_all(FanOut([b"hs1", b"hs2", b"hs9"], "pool/p/H200", b"g", 5),
                        [b"hs1", b"hs2", b"hs9"], full=full, gone=gone)
    assert (full, gone) == ([b"hs1"], [b"hs9"])
    assert [(s.frame, s.offset) for s in other.pending] == [(b"g", 5)]
    assert [s.offset for s in stream.pending] == [1, 2]
    Shell.store.close()
