"""Whether a data link's retransmissions say that the path under a still communicator
is dead. Sans-I/O: each pass's retransmission rates and the time in, a judgement out.

A path that black-holes packets (an nft partition, a switch dropping them) leaves the
link up and its error counters still: the host's only trace is TCP retransmitting the
flows that had data in flight, with exponential backoff (RFC 6298 5.5: every
unanswered retransmission doubles the timeout; Linux starts at 200 ms and caps it at
120 s). A loss TCP recovers from is repaired within a few round trips: its
retransmissions are a burst. So a link is judged to carry a dead path under a
communicator when, since the communicator went still, its retransmissions

- went on for ``retransmit_window`` seconds, first to last (a burst does not),
- counted ``retransmit_segments`` at least (two stray losses far apart do not), and
- have not stopped: the time since the last one is under the span before it plus the
  window (backoff at most doubles the gap between two retransmissions, so a dead flow
  always passes this; retransmissions that ended while the job stayed still for some
  other reason stop counting).

Retransmissions before the communicator went still never count: a busy link's
occasional losses while a job moves say nothing about why it stopped, and a
communicator that moves (a straggler's) is never judged from them.

A link's rate stands between the observer's reads (once a second with eBPF), so each
pass adds ``rate x time since the last pass``; consecutive passes with retransmissions
make one run. Runs are kept only as far back as the stillest communicator needs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

#: Runs kept per link at most, so that judging costs bounded work per communicator (a
#: dead flow makes a few dozen in its 15 minutes of backoff; a link retransmitting on
#: and off for hours under a still job more): the oldest go first, which only shortens
#: the span the window is measured on.
MAX_RUNS = 256


@dataclass
class Run:
    """Consecutive passes that saw a link retransmit: from, to, segments."""

    start: float
    end: float
    segments: float


@dataclass(frozen=True)
class Evidence:
    """What a link retransmitted since a moment: first and last seen, how many."""

    first: float
    last: float
    segments: float


@dataclass
class RetransmitWatch:
    window: float
    segments: float
    runs: dict[str, list[Run]] = field(default_factory=dict)
    last_pass: float | None = None

    def observe(self, rates: Iterable[tuple[str, float]], now: float) -> None:
        """One pass: each data link's retransmitted segments per second."""
        span = 0.0 if self.last_pass is None else max(0.0, now - self.last_pass)
        for name, per_s in rates:
            if per_s <= 0:
                continue
            runs = self.runs.setdefault(name, [])
            if runs and runs[-1].end == self.last_pass:
                runs[-1].end = now
                runs[-1].segments += per_s * span
            else:
                runs.append(Run(now, now, per_s * span))
                del runs[:-MAX_RUNS]
        self.last_pass = now

    def forget_before(self, horizon: float) -> None:
        """Runs that ended before ``horizon`` (no still communicator needs them)."""
        for name in list(self.runs):
            kept = [run for run in self.runs[name] if run.end > horizon]
            if kept:
                self.runs[name] = kept
            else:
                del self.runs[name]

    def evidence(self, name: str, since: float) -> Evidence | None:
        """The link's retransmissions after ``since`` (a run across it counts pro rata)."""
        first = last = None
        segments = 0.0
        for run in self.runs.get(name, ()):
            if run.end <= since:
                continue
            start = max(run.start, since)
            share = (run.end - start) / (run.end - run.start) if run.end > run.start else 1.0
            segments += run.segments * share
            first = start if first is None else first
            last = run.end
        if first is None or last is None:
            return None
        return Evidence(first, last, segments)

    def sustained(self, evidence: Evidence | None, now: float) -> bool:
        if evidence is None:
            return False
        span = evidence.last - evidence.first
        return (span >= self.window and evidence.segments >= self.segments
                and now - evidence.last < span + self.window)

    def dead_paths(self, since: float, now: float) -> tuple[str, ...]:
        """The links that have retransmitted, sustained and ongoing, since ``since``."""
        return tuple(sorted(name for name in self.runs
                            if self.sustained(self.evidence(name, since), now)))

    def lapses_at(self, names: Iterable[str], since: float) -> float | None:
        """When the first of ``names`` stops being judged a dead path since ``since``, if
        none retransmits again."""
        times = []
        for name in names:
            found = self.evidence(name, since)
            if found is not None:
                times.append(found.last + (found.last - found.first) + self.window)
        return min(times, default=None)
