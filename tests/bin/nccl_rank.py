"""A stand-in for one NCCL rank: the real tuner plugin, driven as NCCL drives it.

    nccl_rank.py LIBRARY COMM_ID N_RANKS N_NODES RATE OUT [--abi N] [--nccl VERSION]
                 [--limit N]

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


def main() -> int:
    parser = argparse.ArgumentParser()
    for name in ("library", "comm", "ranks", "nodes", "rate", "out"):
        parser.add_argument(name)
    parser.add_argument("--abi", type=int, default=5)
    parser.add_argument("--nccl", type=int, default=None)
    parser.add_argument("--limit", type=int, default=0)
    args = parser.parse_args()
    if args.nccl is not None:
        load_fake_nccl(args.nccl)
    rank = Rank(int(args.comm, 0), int(args.ranks), int(args.nodes),
                job=os.environ.get("HARMONAIZE_JOB"),
                directory=os.environ.get("HARMONAIZE_TUNER_DIR"), abi=args.abi,
                library=args.library)
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    period = 1.0 / float(args.rate)
    last = None
    n = 0
    deadline = time.monotonic()
    with open(args.out, "a", buffering=1) as log:
        while not stop and (not args.limit or n < args.limit):
            outcome = rank.call()
            if outcome != last:
                log.write(f"{n} {outcome}\n")
                last = outcome
            n += 1
            deadline += period
            delay = deadline - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -1.0:
                deadline = time.monotonic()  # it waited in the plugin: no burst after
        log.write(f"end {n}\n")
    rank.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
