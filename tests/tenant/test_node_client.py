"""The Node.js feed client (tests/clients/node), written from docs/wire.md and the spec
alone, against a real controller and beside the Python FeedClient: both must receive
the same topics, sequence numbers and bodies, through refusals, real loss, restarts
and a new epoch; its declarations and notice answers get the controller's codes; and
the published spec passes the official AsyncAPI parser."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from harmonaize import messages as m
from tests.conftest import ROOT, needs_root
from tests.controller.test_feed import SUMMARY, Sender, advice, place
from tests.daemons import FakeAgent, keyring, start_controller, tenant_feed
from tests.daemons import wait_until as wait
from tests.nodefeed import (
    CLIENT,
    JOB,
    NodeFeed,
    PythonFeed,
    agree,
    burst,
    by_topic,
    is_marker,
    no_violations,
    same_feed,
    seen,
)

pytestmark = [pytest.mark.tenant, needs_root]

SPEC = ROOT / "docs" / "feed.asyncapi.yaml"
TOPICS = ["pool/", "job/acme/"]
#: Little queued for the Node client on its side: while it stops reading, the
#: controller's queue for it overflows and messages are really lost there.
SLOW_READER = ("--receive-hwm", "1", "--receive-buffer", "4096")


@pytest.fixture(scope="module")
def node() -> str:
    """The node binary, with the client's packages installed by ./scripts/setup."""
    binary = shutil.which("node")
    if binary is None or not (CLIENT / "node_modules" / "zeromq").is_dir():
        pytest.fail("the Node.js client is not installed: run ./scripts/setup", pytrace=False)
    return binary



def test_the_node_clients_own_unit_tests_pass(node: str) -> None:
    run = subprocess.run([node, "--test", "test/envelope.test.js", "test/sequencer.test.js"],
                         cwd=CLIENT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "# fail 0" in run.stdout and "# pass 10" in run.stdout


def test_the_published_spec_passes_the_official_asyncapi_parser(node: str,
                                                                workdir: Path) -> None:
    def check(path: Path) -> tuple[int, dict[str, Any]]:
        run = subprocess.run([node, str(CLIENT / "bin" / "hz-feed.js"), "check-spec", str(path)],
                             capture_output=True, text=True, timeout=120)
        return run.returncode, json.loads(run.stdout.splitlines()[-1])

    code, result = check(SPEC)
    assert code == 0 and result["errors"] == [] and result["parsed"], result
    assert result["version"] == "3.0.0"
    # And the check can fail: an operation on a channel the document lacks.
    broken = workdir / "broken.yaml"
    broken.write_text(SPEC.read_text().replace("$ref: '#/channels/pool'\n",
                                               "$ref: '#/channels/nowhere'\n", 1))
    code, result = check(broken)
    assert code == 1 and result["errors"], result


def test_a_refused_key_ends_in_one_clear_line(spawn, node: str, workdir: Path) -> None:
    controller = start_controller(spawn, workdir)
    ring = keyring(workdir)
    stranger = ring.tenant("mallory", allowed=False)
    hz = [node, str(CLIENT / "bin" / "hz-feed.js"), "watch", "--feed", controller.feed,
          "--topic", "pool/"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*hz, *args], capture_output=True, text=True, timeout=60)

    refused = run("--key", str(stranger.key), "--server-key", str(stranger.server_key))
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        "hz-feed: the controller refused this key: it is not filed with the provider"]
    assert json.loads(refused.stdout.splitlines()[-1])["event"] == "fatal"
    # A wrong server key: the handshake never completes, said once when time is up.
    acme = ring.tenant("acme")
    wrong = run("--key", str(acme.key), "--server-key", str(stranger.key.with_suffix(".key")),
                "--timeout", "3")
    assert wrong.returncode == 1 and len(wrong.stderr.splitlines()) == 1
    assert "handshake failed" in wrong.stderr and "wrong server key" in wrong.stderr
    # A key file that is not one.
    bad = workdir / "bad.key_secret"
    bad.write_text('public-key = "short"\n')
    broken = run("--key", str(bad), "--server-key", str(acme.server_key))
    assert broken.returncode == 1
    assert broken.stderr.splitlines() == [
        f"hz-feed: {bad}: public-key is not a 40-character Z85 key"]
    status = controller.request("status")
    assert status["auth"]["refused"]["unknown tenants key"] >= 1


def test_node_and_python_receive_the_same_feed(spawn, node: str, workdir: Path,
                                               ctx: zmq.Context) -> None:
    # Conditions republished every half second: both clients must skip them.
    controller = start_controller(spawn, workdir, extra="[feed]\nrepublish = 0.5\n")
    place(controller, JOB, "acme", *["h1"] * 16)
    h1, h2 = Sender(FakeAgent(ctx, controller, "h1")), Sender(FakeAgent(ctx, controller, "h2"))
    h1.send(SUMMARY)
    python = PythonFeed(tenant_feed(controller, TOPICS))
    ours = NodeFeed(spawn, node, controller, [*TOPICS, "job/", "job/beta/", "job/acme"])
    answer = ours.wait_for("subscribed")
    assert answer["tenant"] == "acme" and sorted(answer["accepted"]) == sorted(TOPICS)
    assert {r["topic"]: r["code"] for r in answer["refused"]} == {
        "job/": "too-broad", "job/beta/": "not-your-job", "job/acme": "too-broad"}
    wait(lambda: python.got and ours.messages(), what="both clients' first conditions")
    # Capacity moves (GPUs taken and given back, a host joins, one degrades), job
    # messages in between.
    for step in range(6):
        h1.send(m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8, in_use=step)))
        h1.send(advice(JOB, step))
    h2.send(m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8)))
    h2.send(m.HostSummary(m.Health.DEGRADED, True, m.GpuCounts(healthy=8)))
    h1.send(advice(JOB, 15))
    same_feed(ours, python, "15")
    kinds = {e["kind"] for e in ours.messages()}
    assert {"pool-capacity", "job-advisory", "job-health"} <= kinds
    assert len([e for e in ours.messages() if e["kind"] == "pool-capacity"]) >= 3
    # Conditions republished (with the seq they had) reach both, and are not given again.
    wait(lambda: ours.stats()["duplicates"] >= 2, what="republished conditions")
    python.close()
    stats = ours.quit()
    no_violations(stats)
    for topic, seqs in by_topic(seen(ours.messages())).items():
        assert seqs == sorted(set(seqs)), f"{topic} gave a condition twice: {seqs}"
    assert stats["gaps"] == 0 and stats["lost"] == 0


def test_a_declaration_and_notice_answers_get_the_controllers_codes(
    spawn, node: str, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir)
    place(controller, JOB, "acme", *["h1"] * 8)
    agent = FakeAgent(ctx, controller, "h1")
    sender = Sender(agent)
    python = PythonFeed(tenant_feed(controller, ["job/acme/"]))
    ours = NodeFeed(spawn, node, controller, ["job/acme/"])
    ours.wait_for("subscribed")
    declaration = {"job": JOB, "revision": 2, "max_validation_pause": 600,
                   "max_validation_defer": 120,
                   "tuning": [{"collectives": ["allreduce"], "algorithms": ["ring", "tree"],
                               "protocols": ["ll128", "simple"], "min_bytes": 1048576,
                               "min_channels": 4, "max_channels": 32}],
                   "bulk": {"floor_mbps": 2000, "ports": [443], "dscp": [8]}}
    accepted = ours.ask("ok", cmd="declare", body=declaration)
    assert accepted["ok"] is True and accepted["code"] == "" and accepted["request"] == 1
    assert agent.recv().job == JOB  # the declaration reached the job's host
    refusals = {
        "stale": {**declaration, "revision": 1},
        "other": {"job": "job-z"},
        "typo": {"job": JOB, "max_validation_paus": 5},
        "group": {**declaration, "revision": 3, "group": "wheel"},
    }
    codes = {tag: ours.ask(tag, cmd="declare", body=body) for tag, body in refusals.items()}
    assert {tag: r["code"] for tag, r in codes.items()} == {
        "stale": "stale-revision", "other": "not-placed", "typo": "invalid",
        "group": "provider-field"}
    assert all(not r["ok"] and r["error"] for r in codes.values())
    assert "max_validation_paus" in codes["typo"]["error"]
    assert sorted(r["request"] for r in codes.values()) == [2, 3, 4, 5]
    # A validation notice: deferred once, not twice, then approved.
    wall = time.time()
    sender.send(m.ValidationNotice(JOB, ("3",), 600, wall + 40, "v-1", wall + 40))
    notice = ours.wait_for("message", lambda e: e["kind"] == "validation-notice")["body"]
    assert notice["members"] == ["3"] and notice["defer_seconds"] == 120
    assert ours.ask("defer", cmd="answer", notice=notice["id"], action="defer",
                    seconds=60)["ok"] is True
    again = ours.ask("again", cmd="answer", notice=notice["id"], action="defer")
    assert again["ok"] is False and again["code"] == "not-deferrable"
    unknown = ours.ask("unknown", cmd="answer", notice="vn-0000000000000000", action="approve")
    assert unknown["code"] == "no-such-notice"
    assert ours.ask("approve", cmd="answer", notice=notice["id"], action="approve")["ok"] is True
    sender.send(advice(JOB, 1))
    same_feed(ours, python, "1")
    python.close()
    no_violations(ours.quit())
    assert controller.request("status")["feed_stats"]["notice_answers"] == 2


def test_a_gap_from_real_loss_is_repaired(spawn, node: str, workdir: Path,
                                          ctx: zmq.Context) -> None:
    # A small queue per subscriber at the controller: a client that stops reading
    # during a burst really loses messages there (and the replay comes in chunks).
    controller = start_controller(spawn, workdir, extra=(
        "[feed]\nsend_hwm = 100\nsocket_buffer = 16384\nrenew = 3\n"))
    place(controller, JOB, "acme", *["h1"] * 1000)
    sender = Sender(FakeAgent(ctx, controller))
    python = PythonFeed(tenant_feed(controller, ["job/acme/"]))
    ours = NodeFeed(spawn, node, controller, ["job/acme/"], *SLOW_READER,
                    "--gap-timeout", "15")  # generous: a loaded machine replays slowly
    ours.wait_for("subscribed")
    wait(lambda: python.got and ours.messages(), what="both clients' first condition")
    ours.command(cmd="pause")
    ours.wait_for("paused")
    burst(sender, 600)
    dropped = sum(row["dropped"] for row in controller.request("feed"))
    assert dropped > 0, "no loss: the test proves nothing"
    ours.command(cmd="resume")
    sender.send(advice(JOB, 999))
    same_feed(ours, python, "999", timeout=90)
    python.close()
    stats = ours.quit()
    no_violations(stats)
    assert stats["recovered"] >= 1 and stats["gaps"] == 0 and stats["lost"] == 0


def test_a_loss_beyond_retention_is_counted_and_the_feed_goes_on(
    spawn, node: str, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir, extra=(
        "[feed]\nsend_hwm = 100\nsocket_buffer = 16384\nretention = 20\n"))
    place(controller, JOB, "acme", *["h1"] * 1000)
    sender = Sender(FakeAgent(ctx, controller))
    ours = NodeFeed(spawn, node, controller, ["job/acme/"], *SLOW_READER,
                    "--gap-timeout", "1")
    ours.wait_for("message")
    ours.command(cmd="pause")
    ours.wait_for("paused")
    burst(sender, 600)
    ours.command(cmd="resume")
    sender.send(advice(JOB, 999))
    ours.wait_for("message", lambda e: is_marker(e, "999"), timeout=60)
    stats = ours.quit()
    seqs = [e["seq"] for e in ours.messages()]
    assert seqs == sorted(set(seqs))
    lost = sum(e["count"] for e in ours.of("lost"))
    assert stats["gaps"] >= 1 and lost == stats["lost"] > 0
    # Every number from the first to the last was given, counted lost, or was a
    # condition equal to the one before (not given again, by design).
    assert seqs[-1] - seqs[0] + 1 - len(seqs) == lost + stats["unchanged"]
    no_violations(stats)


def test_a_restarted_node_client_resumes_from_its_saved_positions(
    spawn, node: str, workdir: Path, ctx: zmq.Context
) -> None:
    controller = start_controller(spawn, workdir)
    place(controller, JOB, "acme", *["h1"] * 16)
    sender = Sender(FakeAgent(ctx, controller))
    sender.send(SUMMARY)
    python = PythonFeed(tenant_feed(controller, TOPICS))
    state = workdir / "feed.json"
    first = NodeFeed(spawn, node, controller, TOPICS, "--state", str(state))
    first.wait_for("subscribed")
    for i in range(3):
        sender.send(advice(JOB, i))
    first.wait_for("message", lambda e: is_marker(e, "2"))
    first.quit()
    saved = json.loads(state.read_text())
    assert saved["positions"] and saved["epoch"] == python.feed.epoch
    for i in range(3, 8):  # while it is away: job messages and a capacity change
        sender.send(advice(JOB, i))
    sender.send(m.HostSummary(m.Health.HEALTHY, True, m.GpuCounts(healthy=8, in_use=4)))
    back = NodeFeed(spawn, node, controller, TOPICS, "--state", str(state))
    sender.send(advice(JOB, 8))
    back.wait_for("message", lambda e: is_marker(e, "8"))
    wait(lambda: any(is_marker(g, "8") for g in python.got), what="python's advisory 8")
    python.close()
    # Nothing missed, nothing twice: the two runs together are one feed.
    agree(seen(first.messages()) + seen(back.messages()), list(python.got), "8")
    assert any(is_marker(e, "5") for e in seen(back.messages()))  # sent while it was away
    stats = back.quit()
    no_violations(stats)
    assert stats["resets"] == 0


def test_a_new_epoch_resets_the_node_client_like_the_python_one(
    spawn, node: str, workdir: Path, ctx: zmq.Context
) -> None:
    """Positions saved under another epoch (here one of 2^62, as a database begun by
    version 0.1 may hold) mean nothing: both clients start every topic again at 1."""
    controller = start_controller(spawn, workdir)
    place(controller, JOB, "acme", *["h1"] * 8)
    sender = Sender(FakeAgent(ctx, controller))
    for i in range(5):
        sender.send(advice(JOB, i))
    old_epoch = 2**62
    stale = {"job/acme/job-a/": 500}
    state = workdir / "feed.json"
    state.write_text(json.dumps({"epoch": old_epoch, "positions": stale}))
    python = PythonFeed(tenant_feed(controller, ["job/acme/"], resume=stale, epoch=old_epoch))
    ours = NodeFeed(spawn, node, controller, ["job/acme/"], "--state", str(state))
    answer = ours.wait_for("subscribed")
    assert answer["reset"] is True and answer["epoch"] != old_epoch
    sender.send(advice(JOB, 5))
    same_feed(ours, python, "5")
    assert next(e["seq"] for e in ours.messages()) == 1
    python.close()
    stats = ours.quit()
    assert stats["resets"] == 1 == python.feed.stats.resets
    assert json.loads(state.read_text())["epoch"] == answer["epoch"]
    no_violations(stats)


def test_a_controller_begun_anew_resets_the_node_client_while_it_runs(
    spawn, node: str, workdir: Path, ctx: zmq.Context
) -> None:
    """The database lost and begun anew under a running client: a new epoch, every
    topic numbered from 1 again, seen at the next renewal by both clients alike."""
    fast = "[feed]\nrenew = 1\n"
    controller = start_controller(spawn, workdir, extra=fast)
    ports = (int(controller.listen.rsplit(":", 1)[1]), int(controller.feed.rsplit(":", 1)[1]))
    place(controller, JOB, "acme", *["h1"] * 16)
    sender = Sender(FakeAgent(ctx, controller))
    python = PythonFeed(tenant_feed(controller, ["job/acme/"]))
    ours = NodeFeed(spawn, node, controller, ["job/acme/"])
    before = ours.wait_for("subscribed")["epoch"]
    # More before than after: the new epoch's first numbers are ones the clients
    # hold, whichever comes first, their renewal or the new messages.
    for i in range(8):
        sender.send(advice(JOB, i))
    same_feed(ours, python, "7")
    controller.proc.terminate()
    controller.proc.wait(timeout=30)
    for database in workdir.glob("controller.db*"):
        database.unlink()
    controller = start_controller(spawn, workdir, extra=fast, ports=ports)
    place(controller, JOB, "acme", *["h1"] * 16)
    sender = Sender(FakeAgent(ctx, controller, "h1"))
    for i in range(10, 13):
        sender.send(advice(JOB, i))
    reset = ours.wait_for("subscribed", lambda e: e["reset"])
    assert reset["epoch"] != before
    wait(lambda: any(is_marker(g, "12") for g in python.got), what="python's advisory 12")
    ours.wait_for("message", lambda e: is_marker(e, "12"))
    python.close()
    stats = ours.quit()
    assert stats["resets"] == 1 == python.feed.stats.resets
    ranks = [e["body"]["ranks"][0] for e in ours.messages() if e["kind"] == "job-advisory"]
    theirs = [g["body"]["ranks"][0] for g in python.got if "advice" in g["body"]]
    assert ranks == theirs == [*map(str, range(8)), "10", "11", "12"], (ranks, theirs)
    no_violations(stats)

