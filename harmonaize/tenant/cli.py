"""``harmonaize-tenant``: the tenant's command line."""

from __future__ import annotations

import argparse
import json
import sys
import time

from harmonaize.messages import PoolCapacity
from harmonaize.schema import to_plain
from harmonaize.tenant.client import FeedClient, FeedMessage


def describe(message: FeedMessage) -> str:
    body = message.body
    if isinstance(body, PoolCapacity):
        return (
            f"pool={body.pool} class={body.gpu_class} hosts_up={body.hosts_up} "
            f"hosts_down={body.hosts_down} gpus_available={body.gpus_available} "
            f"trend={body.trend.value}"
        )
    return " ".join(f"{k}={v}" for k, v in to_plain(body).items())


def _watch(args: argparse.Namespace) -> int:
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    shown = 0
    with FeedClient(args.feed, args.topic or ["pool/"]) as feed:
        while args.count is None or shown < args.count:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                break
            message = feed.recv(timeout=remaining)
            if message is None:
                break
            shown += 1
            if args.json:
                print(json.dumps({
                    "topic": message.topic, "seq": message.seq, "time": message.time,
                    "kind": message.kind, "category": message.category.value,
                    "body": to_plain(message.body),
                }), flush=True)
            else:
                stamp = time.strftime("%H:%M:%S", time.localtime(message.time))
                print(f"{stamp} {message.topic} {message.kind}: {describe(message)}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="harmonaize-tenant", description="HarmonAIze tenant client"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    watch = sub.add_parser("watch", help="print feed messages as they arrive")
    watch.add_argument("--feed", default="tcp://127.0.0.1:7401",
                       help="the controller's feed endpoint (default %(default)s)")
    watch.add_argument("--topic", action="append",
                       help="topic prefix to subscribe to (repeatable; default pool/)")
    watch.add_argument("--json", action="store_true", help="one JSON object per line")
    watch.add_argument("--count", type=int, help="exit after this many messages")
    watch.add_argument("--timeout", type=float, help="exit after this many seconds")
    args = parser.parse_args(argv)
    try:
        return _watch(args)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
