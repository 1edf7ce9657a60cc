"""A recording tenant for cluster tests: FeedClient over a list of replicas, writing
every message it is given as a JSON line (topic, seq, kind, body, the replica it came
through) and its counters to ``RECORD.status``."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

from harmonaize.schema import to_plain
from harmonaize.tenant.client import FeedClient


def main(args: argparse.Namespace) -> None:
    with FeedClient(args.endpoint, args.topic, key=args.key, server_key=args.server_key,
                    failover=args.failover) as feed, Path(args.record).open("a") as record:
        status = Path(f"{args.record}.status")
        written = 0.0
        while True:
            message = feed.recv(timeout=0.2)
            if message is not None:
                record.write(json.dumps({
                    "topic": message.topic, "seq": message.seq, "kind": message.kind,
                    "body": to_plain(message.body), "via": feed.endpoint,
                    "at": time.time()}) + "\n")
                record.flush()
            if time.monotonic() - written > 0.2:
                written = time.monotonic()
                status.write_text(json.dumps({
                    "endpoint": feed.endpoint, "failovers": feed.failovers,
                    "epoch": feed.epoch, "positions": feed.positions,
                    "stats": asdict(feed.stats)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint", action="append", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--server-key", required=True)
    parser.add_argument("--record", required=True)
    parser.add_argument("--failover", type=float, default=2.0)
    main(parser.parse_args())
