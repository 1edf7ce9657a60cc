"""Tenants' requests as the controller takes them: strict decoding, then the
subscription rules. Only WireError may come out, and no subscription may
reach a topic that is not the tenant's."""

from __future__ import annotations

from common import OURS, atheris, run

with atheris.instrument_imports(include=OURS):
    from controller.feed import FeedHub, may_see
    from harmonaize.messages import TENANT_KINDS, Subscribe, WireError, decode

TOPICS = {"pool/p/H200": 4, "job/acme/j1/": 9, "job/other/j2/": 3, "job/acme2/j3/": 1}


def one(data: bytes) -> None:
    try:
        envelope = decode(data, allowed=TENANT_KINDS, strict=True)
    except WireError:
        return
    body = envelope.body
    if isinstance(body, Subscribe):
        hub = FeedHub()
        result = hub.subscribe(b"peer", "acme", body, 1.0, TOPICS, epoch=5)
        for position in result.reply.positions:
            if not may_see("acme", position.topic):
                raise AssertionError(f"acme was shown {position.topic}")
        for topic, _ in result.replay:
            if not may_see("acme", topic):
                raise AssertionError(f"acme was replayed {topic}")


if __name__ == "__main__":
    run(one)
