"""A stand-in for one NCCL rank: the real tuner plugin, driven as NCCL drives it.

    nccl_rank.py LIBRARY COMM_ID N_RANKS N_NODES RATE OUT [--abi N] [--nccl VERSION]
                 [--limit N] [--sync HOST:PORT --rank R] [--pauses SPEC] [--slow SECONDS]

Loads the plugin, initialises a context for communicator COMM_ID (NCCL's
commId, the same on every rank) through ABI version N (default 5) and issues
RATE allreduces of 4 MiB per second until SIGTERM (or LIMIT collectives),
each through getCollInfo with a cost table as NCCL builds it (Tree and Ring
with LL, LL128 and Simple; Ring/LL cheapest, so that is NCCL's own choice).
Each time the outcome changes it appends "INDEX ALGO PROTO CHANNELS" to OUT:
the collective index from which the plugin's answer (the cheapest enabled
entry after it ran, and nChannels) was different, and "end N" when it stops
after N collectives. ``--nccl`` makes a
stand-in NCCL of that version visible first (channel caps apply from 2.31).
The environment names the job (HARMONAIZE_JOB) and the policy directory
(HARMONAIZE_TUNER_DIR), as a launcher would.

A rank that reaches a switching point not yet confirmed waits inside the
plugin, as a real rank would; SIGTERM then takes effect once it resumes.

Coupled ranks (``--sync``, testbed/rendezvous.py) block as NCCL ranks do: after
issuing collective N (what the plugin's stats count) a rank waits until every rank of
the communicator (rank R of N_RANKS) has issued N before it issues N+1; it sleeps in
``select`` meanwhile and SIGTERM ends it there too. ``--pauses INDEX:SECONDS,...``:
after collective INDEX (and its barrier) the rank pauses that long, as every rank of a
job does together for an evaluation, a checkpoint or input. ``--slow SECONDS``: the
rank takes that much longer before each collective (a straggler). SIGUSR1 holds the
rank (it issues nothing, its process running: stuck in data loading), SIGUSR2 releases
it. Every option but ``--sync`` also works uncoupled.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from testbed.plugin import Rank, load_fake_nccl
from testbed.rendezvous import Barrier, Stopped, Waiter, parse_address


def pauses(spec: str) -> dict[int, float]:
    """``INDEX:SECONDS[,INDEX:SECONDS...]`` (empty: none)."""
    out: dict[int, float] = {}
    for item in filter(None, spec.split(",")):
        index, sep, seconds = item.partition(":")
        try:
            value = float(seconds)
            if not sep or not index.isdigit() or not 0 <= value <= 86_400:
                raise ValueError
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"not INDEX:SECONDS (seconds 0-86400): {item!r}") from None
        out[int(index)] = value
    return out


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"not seconds in 0-3600: {text!r}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("library", "comm", "ranks", "nodes", "rate", "out"):
        parser.add_argument(name)
    parser.add_argument("--abi", type=int, default=5)
    parser.add_argument("--nccl", type=int, default=None)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--sync", default="", metavar="HOST:PORT")
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--pauses", type=pauses, default={}, metavar="INDEX:SECONDS,...")
    parser.add_argument("--slow", type=seconds, default=0.0, metavar="SECONDS")
    args = parser.parse_args()
    address = None
    if args.sync:
        try:
            address = parse_address(args.sync)
        except ValueError as exc:
            parser.error(str(exc))
        if args.rank is None or not 0 <= args.rank < int(args.ranks):
            parser.error(f"--sync needs --rank in 0..{int(args.ranks) - 1}")
    waiter = Waiter()

    def stop(*_: object) -> None:
        waiter.stop = True
        waiter.wake()

    def hold(held: bool) -> None:
        waiter.held = held
        waiter.wake()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGUSR1, lambda *_: hold(True))
    signal.signal(signal.SIGUSR2, lambda *_: hold(False))
    if args.nccl is not None:
        load_fake_nccl(args.nccl)
    rank = Rank(int(args.comm, 0), int(args.ranks), int(args.nodes),
                job=os.environ.get("HARMONAIZE_JOB"),
                directory=os.environ.get("HARMONAIZE_TUNER_DIR"), abi=args.abi,
                library=args.library)
    try:
        barrier = (Barrier(address, int(args.comm, 0), int(args.ranks), args.rank,
                           waiter=waiter)
                   if address is not None else None)
    except OSError as exc:
        print(f"nccl_rank: cannot reach the rendezvous at {args.sync}: {exc}", file=sys.stderr)
        rank.close()
        return 2
    period = 1.0 / float(args.rate)
    last = None
    n = 0
    code = 0
    deadline = time.monotonic()
    with open(args.out, "a", buffering=1) as log:
        try:
            while not waiter.stop and (not args.limit or n < args.limit):
                waiter.hold()
                if args.slow:
                    waiter.sleep(args.slow)
                if waiter.stop:
                    break
                outcome = rank.call()
                if outcome != last:
                    log.write(f"{n} {outcome}\n")
                    last = outcome
                n += 1
                if barrier is not None:
                    barrier.wait(n - 1)
                if n - 1 in args.pauses:
                    waiter.sleep(args.pauses[n - 1])
                    deadline = time.monotonic()
                deadline += period
                delay = deadline - time.monotonic()
                if delay > 0:
                    waiter.sleep(delay)
                elif delay < -1.0:
                    deadline = time.monotonic()  # it waited (plugin, fellows): no burst after
        except Stopped:
            pass
        except ConnectionError as exc:
            print(f"nccl_rank: {exc}", file=sys.stderr)
            code = 3
        log.write(f"end {n}\n")
    if barrier is not None:
        barrier.close()
    rank.close()
    return code


if __name__ == "__main__":
    sys.exit(main())
