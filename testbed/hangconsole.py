"""The hang lab by hand: ``python -m testbed.hangconsole`` (as root, PYTHONPATH at the
tree). It starts testbed/hanglab.py's lab with eight coupled ranks, prints where
everything is, then every message the tenant gets, and takes faults on its input:

    stop R | cont R | kill R     SIGSTOP, SIGCONT, SIGKILL member R's process
    hold R | release R           R stops issuing collectives, its process running
    xid R [XID]                  an XID (default 48) on R's GPU in the fake NVML
    cut HOST | mend              drop HOST's data path at the data bridge (nft) | undo
    restart                      new ranks, a new communicator
    pause SECONDS                ... whose ranks all pause together that long at collective 100
    slow R SECONDS               ... whose member R takes that much longer per collective
    quit                         (or end of input, Ctrl-C) tear everything down

Anything else is answered with one line. ``--settings`` takes ``[jobhealth]`` keys for
the agents and the controller (e.g. ``stall_after = 10``).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from testbed.hangjob import HOSTS, N_RANKS, LabJob
from testbed.hanglab import TENANT, HangLab

#: Where ``pause`` makes every rank pause (5 s in, at the lab's rate).
PAUSE_AT = 100
SIGNALS = {"stop": signal.SIGSTOP, "cont": signal.SIGCONT, "kill": signal.SIGKILL}


def describe(message: dict[str, Any]) -> str:
    body = message.get("body", {})
    if message.get("kind") == "job-progress":
        return (f"job-progress {body['job']} comm {body['comm']:#x}: {body['finding']} "
                f"{body['state']}, ranks {', '.join(body['ranks']) or '-'} "
                f"({body['cause']}) at collective {body['at_collective']}")
    return f"{message.get('kind')} {message.get('topic')}"


def where(lab: HangLab, job: LabJob) -> str:
    lines = [f"namespaces: {', '.join(lab.lab.ns(h) for h in lab.lab.hosts)}",
             "data path: " + ", ".join(f"{h} data0 {lab.data_addr(h)}" for h in HOSTS)
             + f"; rendezvous {lab.rendezvous}",
             f"operators: harmonctl -s {lab.cluster.socket('h0')} job-health; harmonctl -C "
             f"{lab.cluster.admin_socket} job-findings",
             f"job {job.name}, communicator {job.comm:#x}, tenant {TENANT} watching "
             f"job/{TENANT}/:"]
    lines += [f"  member {r}: pid {job.pid(r)} on {job.host_of(r)}, GPU {job.gpu_of(r)}"
              for r in range(N_RANKS)]
    return "\n".join(lines)


def command(lab: HangLab, job: LabJob, words: list[str]) -> str:
    """Do one command; what to print."""
    verb, args = words[0], words[1:]
    rank = int(args[0]) if args and args[0].isdigit() else -1
    needs_rank = verb in (*SIGNALS, "hold", "release", "xid", "slow")
    if needs_rank and not 0 <= rank < N_RANKS:
        return f"{verb} needs a member, 0-{N_RANKS - 1}"
    if verb in ("pause", "slow"):
        seconds = _seconds(args[-1] if len(args) == (2 if verb == "slow" else 1) else "")
        if seconds is None:
            return f"{verb}: {'R ' if verb == 'slow' else ''}SECONDS, seconds in 0-3600"
        if verb == "pause":
            job.start(pauses={PAUSE_AT: seconds})
        else:
            job.start(slow={rank: seconds})
        job.running(collectives=2)
        return where(lab, job)
    if verb in SIGNALS:
        job.signal(rank, SIGNALS[verb])
    elif verb == "hold":
        job.hold(rank)
    elif verb == "release":
        job.release(rank)
    elif verb == "xid":
        if len(args) > 1 and not args[1].isdigit():
            return "xid R [XID]: XID is a number"
        job.gpu_fault(rank, int(args[1]) if len(args) > 1 else 48)
    elif verb == "cut" and args[:1] and args[0] in HOSTS:
        lab.cut(args[0])
    elif verb == "mend":
        lab.mend()
    elif verb == "restart":
        job.start()
        job.running()
        return where(lab, job)
    else:
        return f"unknown: {' '.join(words)!r} (stop|cont|kill|hold|release|xid R, cut " \
               f"{'|'.join(HOSTS)}, mend, restart, pause S, slow R S, quit)"
    return "done"


def _seconds(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if 0 <= value <= 3600 else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hangconsole", description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", default="", help="[jobhealth] keys, TOML")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        with HangLab(settings=args.settings.replace("\\n", "\n").rstrip() + "\n"
                     if args.settings else "", tag="hcon") as lab:
            job = lab.first
            job.start()
            job.running()
            print(where(lab, job), flush=True)
            threading.Thread(target=show, args=(lab,), daemon=True).start()
            for line in sys.stdin:
                words = line.split()
                if words == ["quit"]:
                    break
                if words:
                    try:
                        print(command(lab, job, words), flush=True)
                    except (OSError, RuntimeError, AssertionError, ValueError) as exc:
                        print(f"{words[0]}: {exc}", flush=True)  # a dead pid, a wait ran out
    except KeyboardInterrupt:
        pass
    except (OSError, RuntimeError, AssertionError) as exc:
        print(f"hangconsole: {exc}", file=sys.stderr)
        return 1
    return 0


def show(lab: HangLab) -> None:
    seen = 0
    while True:
        for message in lab.messages_after(seen, 1.0):
            seen += 1
            print(f"tenant: {describe(message)}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
