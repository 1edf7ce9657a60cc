"""``harmonaize-tenant``: the tenant's command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from harmonaize import keys, wireaudit
from harmonaize.messages import (
    ApplicationXid,
    Flexible,
    JobDeclaration,
    JobProgress,
    Negotiated,
    Outcome,
    PoolCapacity,
)
from harmonaize.messages.jobhealth import Cause, Finding, ProgressState
from harmonaize.schema import from_plain, to_plain
from harmonaize.tenant.client import FeedClient, FeedError, FeedMessage, RequestError

KEY_ENV = "HARMONAIZE_TENANT_KEY"
SERVER_KEY_ENV = "HARMONAIZE_SERVER_KEY"


def describe(message: FeedMessage) -> str:
    body = message.body
    if isinstance(body, PoolCapacity):
        return (
            f"pool={body.pool} class={body.gpu_class} hosts_up={body.hosts_up} "
            f"hosts_down={body.hosts_down} gpus_available={body.gpus_available} "
            f"trend={body.trend.value}"
        )
    if isinstance(body, JobProgress):
        return describe_progress(body)
    if isinstance(body, ApplicationXid):
        ranks = ", ".join(body.ranks) or "a rank of the job"
        return (f"job {body.job}: your process on rank {ranks} hit XID {body.xid} "
                f"({body.fault.value})" + (" while it was ending" if body.teardown else "")
                + ": the job's own fault, no hardware was taken out of service")
    return " ".join(f"{k}={v}" for k, v in to_plain(body).items())


#: What each finding says of the ranks named, in a line.
FINDING_TEXT = {
    Finding.HANG: "did not issue collective {at}, which the job's other ranks wait in",
    Finding.STALL: "stopped with every rank at collective {at}",
    Finding.STRAGGLER: "are the last to issue collectives, behind by a margin, since {at}",
}
CAUSE_TEXT = {
    Cause.PROCESS_EXITED: "the rank's process exited",
    Cause.PROCESS_NOT_RUNNING: "the rank's process is stopped or stuck in the kernel",
    Cause.GPU_FAULT: "the rank's GPU has a fault",
    Cause.NETWORK: "the rank's host's network has errors",
    Cause.PAUSED: "the job paused itself",
    Cause.UNKNOWN: "its process runs; no fault found",
}


def describe_progress(body: JobProgress) -> str:
    """One readable line: which ranks, what, why (the --json line keeps every field)."""
    ranks = ", ".join(body.ranks) or "-"
    what = FINDING_TEXT.get(body.finding, body.finding.value).format(at=body.at_collective)
    if body.state is ProgressState.WITHDRAWN:
        return (f"job {body.job} comm {body.comm:#x}: {body.finding.value} of rank(s) {ranks} "
                "withdrawn: the ranks move again, or the job ended")
    return (f"job {body.job} comm {body.comm:#x}: {body.finding.value.upper()}: rank(s) "
            f"{ranks} {what} ({body.cause.value}: {CAUSE_TEXT.get(body.cause, '')})")


DEFAULT_FEED = "tcp://127.0.0.1:7401"


def _client(args: argparse.Namespace, topics: list[str],
            state: tuple[int, dict[str, int]] | None = None) -> FeedClient:
    epoch, resume = state or (0, None)
    return FeedClient(args.feed or [DEFAULT_FEED], topics, key=args.key or None,
                      server_key=args.server_key or None, resume=resume, epoch=epoch)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _load_state(path: Path | None) -> tuple[int, dict[str, int]] | None:
    """(the feed epoch, positions) from ``--state``: ``{"epoch": E, "positions": {...}}``.

    A bare map of topic to sequence number (as older versions wrote) has no epoch.
    """
    if path is None or not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"harmonaize-tenant: {path}: unreadable state: {exc}") from None
    epoch, positions = 0, data
    if isinstance(data, dict) and "positions" in data:
        epoch, positions = data.get("epoch", 0), data["positions"]
    if not _is_count(epoch) or not isinstance(positions, dict) or not all(
            isinstance(k, str) and _is_count(v) for k, v in positions.items()):
        raise SystemExit(f"harmonaize-tenant: {path}: not a feed epoch and a map of topic to "
                         "sequence number")
    return epoch, positions


def _save_state(path: Path | None, feed: FeedClient) -> None:
    if path is not None:
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps({"epoch": feed.epoch, "positions": feed.positions},
                                  sort_keys=True))
        tmp.replace(path)


def _watch(args: argparse.Namespace) -> int:
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    shown = 0
    with _client(args, args.topic or ["pool/"], _load_state(args.state)) as feed:
        try:
            while args.count is None or shown < args.count:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                message = feed.recv(timeout=remaining)
                if message is None:
                    break
                shown += 1
                _show(message, args.json)
                _save_state(args.state, feed)
        finally:
            for refusal in feed.refused:
                print(f"harmonaize-tenant: refused {refusal.topic!r}: {refusal.reason}",
                      file=sys.stderr)
        if feed.stats.subscriptions == 0 and args.timeout is not None:
            # Not one answer: say so (and why, if the connection told us) rather than
            # exit as if the feed had simply been quiet.
            why = feed.problem or "is the feed address right, and the controller up?"
            where = ", ".join(args.feed or [DEFAULT_FEED])
            print(f"harmonaize-tenant: no answer from {where} within {args.timeout:g} s: "
                  f"{why}", file=sys.stderr)
            return 1
    return 0


def _show(message: FeedMessage, as_json: bool) -> None:
    if as_json:
        print(json.dumps({
            "topic": message.topic, "seq": message.seq, "time": message.time,
            "kind": message.kind, "category": message.category.value,
            "body": to_plain(message.body),
        }), flush=True)
    else:
        stamp = time.strftime("%H:%M:%S", time.localtime(message.time))
        print(f"{stamp} {message.topic} {message.kind}: {describe(message)}", flush=True)


def _declare(args: argparse.Namespace) -> int:
    try:
        data: Any = json.load(args.file)
        declaration = from_plain(JobDeclaration, data, "declaration")
    except ValueError as exc:  # JSON and schema errors alike
        print(f"harmonaize-tenant: {args.file.name}: {exc}", file=sys.stderr)
        return 2
    with _client(args, ["pool/"]) as feed:
        try:
            feed.declare(declaration, timeout=args.timeout)
        except RequestError as exc:
            print(f"harmonaize-tenant: declaration refused: {exc}", file=sys.stderr)
            return 1
    print(f"declared {declaration.job} (revision {declaration.revision})")
    return 0


def _notice(args: argparse.Namespace) -> int:
    with _client(args, ["pool/"]) as feed:
        try:
            feed.answer_notice(args.notice, args.action, args.seconds, timeout=args.timeout)
        except RequestError as exc:
            print(f"harmonaize-tenant: {args.action} refused ({exc.code or 'no answer'}): "
                  f"{exc}", file=sys.stderr)
            return 1
    print(f"{args.action}d validation notice {args.notice}"
          + (f" by {args.seconds:g} s" if args.action == "defer" and args.seconds else ""))
    return 0


def describe_negotiated(n: Negotiated) -> str:
    """One line per answer (--json keeps every field); times in UTC."""
    def utc(stamp: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(stamp))
    if n.outcome in (Outcome.OFFER, Outcome.COUNTER):
        how = f" (departs in {n.departs})" if n.departs else ""
        return (f"{n.request_id}: {n.outcome.value}{how} {n.offer_id}: {n.count} GPUs "
                f"{utc(n.start)} to {utc(n.end)} UTC, accept by {utc(n.expires_at)} "
                f"(round {n.round})")
    if n.outcome is Outcome.REFUSAL:
        return f"{n.request_id}: refused ({n.reason})"
    if n.outcome is Outcome.HOLD:
        return (f"{n.request_id}: held: {n.count} GPUs {utc(n.start)} to {utc(n.end)} UTC "
                f"(a no-show after {utc(n.expires_at)})")
    if n.outcome is Outcome.WINDOW:
        return (f"notice {n.request_id}: window {n.state}: {utc(n.start)} to {utc(n.end)} "
                f"UTC (latest start {utc(n.expires_at)})")
    return (f"{n.request_id}: {n.state}" + (f", {n.charged:g} GPU-seconds charged to your "
                                           "record" if n.charged else ""))


def _when(text: str) -> float:
    """A time on the command line: Unix seconds, or +SECONDS from now."""
    try:
        return time.time() + float(text[1:]) if text.startswith("+") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: Unix seconds, or +SECONDS from now"
                                         ) from None


def _negotiate(args: argparse.Namespace) -> int:
    window = {"pool": args.pool, "gpu_class": args.gpu_class, "min_count": args.min,
              "max_count": args.max, "earliest_start": args.earliest,
              "latest_start": args.latest, "duration": args.duration,
              "flexibility": args.flexible} if args.step in ("propose", "counter") else {}
    if window and None in window.values():
        print(f"harmonaize-tenant: negotiate {args.step} needs --pool, --class, --min, "
              "--max, --earliest, --latest and --duration", file=sys.stderr)
        return 2
    if args.at and args.step != "window":
        print("harmonaize-tenant: --at is for negotiate window", file=sys.stderr)
        return 2
    if args.step in ("accept", "reject", "counter") and not args.offer:
        print(f"harmonaize-tenant: negotiate {args.step} needs --offer OFFER_ID",
              file=sys.stderr)
        return 2
    if args.step != "list" and not args.request:
        print(f"harmonaize-tenant: negotiate {args.step} needs a REQUEST id", file=sys.stderr)
        return 2
    with _client(args, ["pool/"]) as feed:
        try:
            if args.step == "list":
                answers = feed.negotiations(timeout=args.timeout)
            elif args.step == "propose":
                answers = (feed.propose(args.request, **window, timeout=args.timeout),)
            elif args.step == "counter":
                answers = (feed.counter(args.request, args.offer, **window,
                                        timeout=args.timeout),)
            elif args.step == "accept":
                answers = (feed.accept(args.request, args.offer, timeout=args.timeout),)
            elif args.step == "reject":
                answers = (feed.reject(args.request, args.offer, timeout=args.timeout),)
            elif args.step == "window":
                answers = (feed.counter_window(args.request, args.at, timeout=args.timeout),)
            else:
                answers = (feed.release(args.request, timeout=args.timeout),)
        except RequestError as exc:
            print(f"harmonaize-tenant: {args.step} refused ({exc.code or 'no answer'}): "
                  f"{exc}", file=sys.stderr)
            return 1
    for answer in answers:
        print(json.dumps(to_plain(answer)) if args.json else describe_negotiated(answer))
    return 0


def _negotiate_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    negotiate = sub.add_parser(
        "negotiate", parents=[common],
        help="reserve capacity in rounds (propose, counter, accept, reject, release, list), "
        "or answer a validation notice's maintenance window (window)")
    negotiate.add_argument("step", choices=["propose", "counter", "accept", "reject",
                                            "release", "list", "window"])
    negotiate.add_argument("request", nargs="?", help="your request id (1-64 of A-Z a-z "
                           "0-9 . _ : -): the negotiation's name in every step; for "
                           "window, the validation notice's id")
    negotiate.add_argument("--at", type=_when, action="append", default=[],
                           help="window: a start you counter with (your checkpoint; up to "
                           "4, each Unix seconds or +SECONDS); none accepts the provider's")
    negotiate.add_argument("--offer", help="the offer's id (accept, reject, counter)")
    negotiate.add_argument("--pool")
    negotiate.add_argument("--class", dest="gpu_class", help="the GPU class")
    negotiate.add_argument("--min", type=int, help="the fewest GPUs you can run with")
    negotiate.add_argument("--max", type=int, help="the most GPUs you can use")
    negotiate.add_argument("--earliest", type=_when,
                           help="earliest start: Unix seconds, or +SECONDS from now")
    negotiate.add_argument("--latest", type=_when, help="latest start, likewise")
    negotiate.add_argument("--duration", type=float, help="seconds it lasts")
    negotiate.add_argument("--flexible", default="none",
                           choices=[f.value for f in Flexible],
                           help="what the controller may counter with (default none)")
    negotiate.add_argument("--json", action="store_true", help="one JSON object per answer")
    negotiate.add_argument("--timeout", type=float, default=10.0)


def _keygen(args: argparse.Namespace) -> int:
    try:
        public, secret = keys.generate(args.dir, args.name)
    except keys.KeyFileError as exc:
        print(f"harmonaize-tenant: {exc}", file=sys.stderr)
        return 1
    print(f"{secret} (keep it here)\n{public} (give this to your provider)")
    return 0


def main(argv: list[str] | None = None) -> int:
    wireaudit.install()  # only where HARMONAIZE_WIRE_AUDIT asks for it
    parser = argparse.ArgumentParser(
        prog="harmonaize-tenant", description="HarmonAIze tenant client"
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--feed", action="append",
                        help=f"the controller's tenant endpoint (default {DEFAULT_FEED}); "
                        "repeat it for each replica of a clustered controller: the "
                        "client moves to the next when its replica goes away")
    common.add_argument("--key", default=os.environ.get(KEY_ENV, ""),
                        help=f"your .key_secret file (or ${KEY_ENV})")
    common.add_argument("--server-key", default=os.environ.get(SERVER_KEY_ENV, ""),
                        help=f"the controller's .key file (or ${SERVER_KEY_ENV})")
    sub = parser.add_subparsers(dest="command", required=True)
    watch = sub.add_parser("watch", parents=[common], help="print feed messages as they arrive")
    watch.add_argument("--topic", action="append",
                       help="topic prefix: pool/ or job/<you>/... (repeatable; default pool/)")
    watch.add_argument("--json", action="store_true", help="one JSON object per line")
    watch.add_argument("--count", type=int, help="exit after this many messages")
    watch.add_argument("--timeout", type=float, help="exit after this many seconds")
    watch.add_argument("--state", type=Path,
                       help="keep positions in this file and resume from it next time")
    declare = sub.add_parser("declare", parents=[common],
                             help="declare what the provider may do to a job (JSON file)")
    declare.add_argument("file", type=argparse.FileType("r"))
    declare.add_argument("--timeout", type=float, default=10.0)
    notice = sub.add_parser("notice", parents=[common],
                            help="answer a validation notice: approve (start now) or defer")
    notice.add_argument("action", choices=["approve", "defer"])
    notice.add_argument("notice", help="the notice's id (validation-notice.id)")
    notice.add_argument("--seconds", type=float, default=0.0,
                        help="defer by this many seconds (default: all your declaration "
                        "allows)")
    notice.add_argument("--timeout", type=float, default=10.0)
    _negotiate_parser(sub, common)
    keygen = sub.add_parser("keygen", help="make your CurveZMQ key pair")
    keygen.add_argument("name", help="your tenant name, as your provider knows you")
    keygen.add_argument("--dir", type=Path, default=Path("."))
    args = parser.parse_args(argv)
    try:
        if args.command == "keygen":
            return _keygen(args)
        if args.command == "declare":
            return _declare(args)
        if args.command == "notice":
            return _notice(args)
        if args.command == "negotiate":
            return _negotiate(args)
        return _watch(args)
    except keys.KeyFileError as exc:
        print(f"harmonaize-tenant: {exc}", file=sys.stderr)
        return 2
    except FeedError as exc:
        print(f"harmonaize-tenant: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
