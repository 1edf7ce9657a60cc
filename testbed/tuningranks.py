"""The campaign's ranks: each a context of the real tuner plugin on a thread of its own,
issuing collectives up to a target the driver raises; and the first collective at which
two ranks answered differently.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from testbed.plugin import Outcome, Rank
from testbed.tuningschedule import JOB


class RankThread:
    """One rank: issues collectives up to a target index the driver raises."""

    def __init__(self, comm: int, n_ranks: int, n_nodes: int, directory: Path,
                 offset: float) -> None:
        self.rank = Rank(comm, n_ranks, n_nodes, job=JOB, directory=directory)
        self.offset = offset
        self.changes: list[tuple[int, Outcome]] = []
        self.target = 0
        self.stalled_until = -1.0
        self._cond = threading.Condition()
        self.idle = threading.Event()
        self._done = False
        self.in_call = False
        self.call_started = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def n(self) -> int:
        return self.rank.n

    def advance(self, target: int) -> None:
        with self._cond:
            if target > self.target:
                self.target = target
                self.idle.clear()
                self._cond.notify()

    def _run(self) -> None:
        stepper = self.rank.stepper()
        last: tuple[bytes, int] | None = None
        rank = self.rank
        while True:
            with self._cond:
                while not self._done and rank.n >= self.target:
                    self.idle.set()
                    self._cond.wait()
                if self._done:
                    return
                goal = self.target
            while rank.n < goal:
                self.call_started = time.monotonic()
                self.in_call = True
                key = stepper.step()
                self.in_call = False
                if key != last:
                    self.changes.append((rank.n - 1, stepper.outcome(key)))
                    last = key
                if rank.n % 4 == 0:
                    # Let the agents' and the controller's code run between collectives,
                    # so their reads and writes interleave with the ranks' progress.
                    time.sleep(0)

    def blocked(self, grace: float = 0.02) -> bool:
        """In a call for longer than any call takes: waiting inside the plugin."""
        return self.in_call and time.monotonic() - self.call_started > grace

    def stop(self) -> None:
        with self._cond:
            self._done = True
            self._cond.notify()

    def close(self) -> None:
        self.stop()
        self.thread.join(timeout=5)
        if not self.thread.is_alive():
            self.rank.close()


def disagreement(ranks: list[RankThread]) -> str:
    """The first collective index at which two ranks answered differently."""
    def answer_at(changes: list[tuple[int, Outcome]], index: int) -> Outcome | None:
        found = None
        for start, outcome in changes:
            if start > index:
                break
            found = outcome
        return found

    for i, a in enumerate(ranks):
        for b in ranks[i + 1:]:
            limit = min(a.n, b.n)
            points = sorted({0, *(s for s, _ in a.changes), *(s for s, _ in b.changes)})
            for index in points:
                if index >= limit:
                    break
                x, y = answer_at(a.changes, index), answer_at(b.changes, index)
                if x != y:
                    return f"collective {index}: one rank ran {x}, another {y}"
    return ""
