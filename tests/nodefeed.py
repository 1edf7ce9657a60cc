"""Two tenant feed clients side by side for tests: the Node.js one (tests/clients/node)
as a subprocess speaking JSON lines, the Python FeedClient on a reading thread, and the
comparison of what they delivered."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
from collections.abc import Callable
from typing import Any

import msgpack

from harmonaize import messages as m
from harmonaize.messages import encode
from harmonaize.tenant.client import FeedClient
from tests.conftest import ROOT, Spawn
from tests.controller.test_feed import Sender, advice
from tests.daemons import Controller, keyring
from tests.daemons import wait_until as wait

CLIENT = ROOT / "tests" / "clients" / "node"
JOB = "job-a"


class NodeFeed:
    """hz-feed watch as a subprocess: its JSON lines read on a thread, commands on stdin."""

    def __init__(self, spawn: Spawn, node: str, controller: Controller, topics: list[str],
                 *options: str, tenant: str = "acme") -> None:
        creds = keyring(controller.workdir).tenant(tenant)
        argv = [node, str(CLIENT / "bin" / "hz-feed.js"), "watch", "--feed", controller.feed,
                "--key", str(creds.key), "--server-key", str(creds.server_key),
                "--json-commands", *options]
        for topic in topics:
            argv += ["--topic", topic]
        self.proc = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))

    def _pump(self) -> None:
        while True:
            try:
                self.events.append(self.lines.get_nowait())
            except queue.Empty:
                return

    def of(self, event: str) -> list[dict[str, Any]]:
        self._pump()
        return [e for e in self.events if e["event"] == event]

    def messages(self) -> list[dict[str, Any]]:
        return self.of("message")

    def wait_for(self, event: str, predicate: Callable[[dict[str, Any]], bool] = bool,
                 timeout: float = 30.0) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                self._pump()
                raise AssertionError(f"hz-feed exited with {self.proc.returncode}: "
                                     f"{self.proc.stderr.read() if self.proc.stderr else ''}")
            return next((e for e in self.of(event) if predicate(e)), None)

        return wait(found, timeout, what=f"hz-feed's {event}")

    def command(self, **cmd: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def ask(self, tag: str, **cmd: Any) -> dict[str, Any]:
        """A request; its reply (matched by the client to the request's number)."""
        self.command(tag=tag, **cmd)
        return self.wait_for("reply", lambda e: e.get("tag") == tag)

    def stats(self) -> dict[str, Any]:
        self.asked = getattr(self, "asked", 0) + 1
        tag = f"stats-{self.asked}"
        self.command(cmd="stats", tag=tag)
        return self.wait_for("stats", lambda e: e.get("tag") == tag)

    def quit(self) -> dict[str, Any]:
        """Stop it; its final stats (and its positions saved with --state)."""
        self.command(cmd="quit")
        assert self.proc.wait(timeout=30) == 0
        self.reader.join(timeout=10)
        self._pump()
        return self.of("stats")[-1]


class PythonFeed:
    """The Python FeedClient, read on a thread so that it keeps up while the test drives."""

    def __init__(self, feed: FeedClient) -> None:
        self.feed = feed
        self.got: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            message = self.feed.recv(timeout=0.1)
            if message is not None:
                self.got.append(wire(message.topic, message.seq, message.body))

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.feed.close()


def wire(topic: str, seq: int, body: m.Message) -> dict[str, Any]:
    """A delivered message as it was on the wire: the body as the provider encodes it."""
    fields = msgpack.unpackb(encode(body, sender="controller"))[6]
    return {"topic": topic, "seq": seq, "body": json.loads(json.dumps(fields))}


def seen(node_messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"topic": e["topic"], "seq": e["seq"], "body": e["body"]} for e in node_messages]


def by_topic(got: list[dict[str, Any]]) -> dict[str, list[int]]:
    topics: dict[str, list[int]] = {}
    for message in got:
        topics.setdefault(message["topic"], []).append(message["seq"])
    return topics


def is_marker(message: dict[str, Any], marker: str) -> bool:
    return message["body"].get("ranks") == [marker]


def agree(node_got: list[dict[str, Any]], python_got: list[dict[str, Any]],
          marker: str) -> None:
    """The same messages per topic, in the same order, once each.

    Python's client reads without loss, so what it got before the advisory for rank
    ``marker`` was published before it: the Node client must have all of that.
    After it (a host's silence noticed, say) either may be further along. A topic's
    first message may differ when one client subscribed later: it takes the present.
    """
    cut = next(i for i, g in enumerate(python_got) if is_marker(g, marker))
    before = python_got[:cut + 1]
    for topic in by_topic(python_got) | by_topic(node_got):
        ours = [g for g in node_got if g["topic"] == topic]
        theirs = [g for g in python_got if g["topic"] == topic]
        seqs = [g["seq"] for g in ours]
        assert seqs == sorted(set(seqs)), f"{topic}: not in order, once: {seqs}"
        if ours and theirs:  # from where both began
            first = max(ours[0]["seq"], theirs[0]["seq"])
            ours = [g for g in ours if g["seq"] >= first]
            theirs = [g for g in theirs if g["seq"] >= first]
            before = [g for g in before if g["topic"] != topic or g["seq"] >= first]
        common = min(len(ours), len(theirs))
        assert ours[:common] == theirs[:common], (
            f"{topic}: node {by_topic(ours)} python {by_topic(theirs)}")
        needed = len([g for g in before if g["topic"] == topic])
        assert len(ours) >= needed, f"{topic}: node lacks {by_topic(theirs[len(ours):needed])}"


def same_feed(node: NodeFeed, python: PythonFeed, marker: str, timeout: float = 45.0) -> None:
    """Both delivered the advisory for rank ``marker``, and agree on what came before."""
    def has(got: list[dict[str, Any]]) -> bool:
        return any(is_marker(g, marker) for g in got)

    try:
        wait(lambda: has(seen(node.messages())) and has(python.got), timeout,
             what=f"both clients to receive advisory {marker}")
    except AssertionError as err:
        raise AssertionError(f"{err}: node {by_topic(seen(node.messages()))} "
                             f"python {by_topic(python.got)}") from None
    agree(seen(node.messages()), list(python.got), marker)


def burst(sender: Sender, count: int, start: int = 0) -> None:
    """Advisories pipelined, as an agent with a backlog sends them, then all acknowledged."""
    for i in range(start, start + count):
        sender.seq += 1
        sender.agent.send(advice(JOB, i), seq=sender.seq)
    sender.acked = sender.wait_ack(sender.seq, timeout=30)


def no_violations(stats: dict[str, Any]) -> None:
    assert stats["violations"] == 0, stats["violations_seen"]
    assert stats["rejected"] == 0
