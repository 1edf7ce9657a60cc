"""Each topic in order, once: the tenant client's delivery rules, apart from its socket.

The controller numbers every topic's messages from 1 without holes. What arrives is held
until everything before it was delivered; a gap is asked for again (through ``ask``) and
skipped, counted in ``stats.gaps``, after ``gap_timeout`` seconds without progress; a
condition is delivered when its content changes. No socket and no clock here: the client
(:mod:`harmonaize.tenant.client`) passes the time in and sends what ``ask`` wants.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from harmonaize.messages import Category, Message, Position

#: While a gap is open, ask for the missing messages again this often (a resend
#: can itself be lost when our queue at the controller is full).
GAP_RETRY = 0.5

#: Asks the controller for what it retains after these positions (now, {topic: seq}).
Ask = Callable[[float, Mapping[str, int]], None]


@dataclass(frozen=True)
class FeedMessage:
    topic: str
    seq: int
    time: float
    body: Message

    @property
    def kind(self) -> str:
        return self.body.KIND

    @property
    def category(self) -> Category:
        return self.body.CATEGORY


@dataclass
class FeedStats:
    received: int = 0
    rejected: int = 0
    repeated_conditions: int = 0
    duplicates: int = 0
    #: Topics where messages were lost for good (beyond what the controller retains).
    gaps: int = 0
    #: Gaps filled from the controller's retention.
    recovered: int = 0
    subscriptions: int = 0
    #: Times the feed's epoch changed under us (positions forgotten, retention replayed).
    resets: int = 0


@dataclass
class TopicState:
    last: int = 0                      # highest seq delivered (or skipped to)
    known: bool = False                # last is meaningful
    delivered: int = 0                 # highest seq this program (or its last run) has had
    held: dict[int, FeedMessage] = field(default_factory=dict)  # waiting behind a gap
    gap_since: float | None = None     # a gap is open since (or made progress at) this time
    asked_at: float = 0.0              # when the missing messages were last asked for
    condition: dict[str, Message] = field(default_factory=dict)  # last delivered, by kind


class Sequencer:
    """Every topic's position, what waits behind a gap, and what is ready to deliver."""

    def __init__(self, stats: FeedStats, ask: Ask, *, resume: Mapping[str, int] | None,
                 skip_repeated_conditions: bool, gap_timeout: float) -> None:
        self.stats = stats
        self.ask = ask
        self.skip_repeated_conditions = skip_repeated_conditions
        self.gap_timeout = gap_timeout
        self.topics: dict[str, TopicState] = {}
        for topic, seq in (resume or {}).items():
            self.topics[topic] = TopicState(last=int(seq), known=True, delivered=int(seq))
        self.ready: deque[FeedMessage] = deque()

    @property
    def positions(self) -> dict[str, int]:
        return {t: s.last for t, s in self.topics.items() if s.known}

    def wakes(self, now: float) -> list[float]:
        """Seconds until each open gap wants attention (asked again, or skipped)."""
        return [min(s.gap_since + self.gap_timeout, s.asked_at + GAP_RETRY) - now
                for s in self.topics.values() if s.gap_since is not None]

    def housekeeping(self, now: float) -> None:
        for topic, state in self.topics.items():
            if state.gap_since is None:
                continue
            if now - state.gap_since >= self.gap_timeout:
                # No progress for that long: not retained any more. Skip, and say so.
                self.stats.gaps += 1
                state.gap_since = None
                state.last = min(state.held) - 1
                self._release(state, now)
            elif now - state.asked_at >= GAP_RETRY:
                state.asked_at = now
                self.ask(now, {topic: state.last})

    def reset(self) -> None:
        """The feed was begun anew: our positions are of another feed. Start every topic
        from 0; the controller replays what it retains (it saw our old epoch)."""
        self.stats.resets += 1
        for state in self.topics.values():
            state.last, state.known, state.delivered = 0, True, 0
            state.held.clear()
            state.gap_since = None

    def learn(self, positions: Iterable[Position]) -> None:
        """The newest numbers of the topics a subscription accepted."""
        for position in positions:
            state = self.topics.setdefault(position.topic, TopicState())
            if not state.known:  # new to us: we want the present, not the past
                state.last, state.known = position.seq, True

    def lost_before(self, oldest: Iterable[Position], now: float) -> None:
        """What we asked for is partly gone: say so now, and go on from what is retained."""
        for position in oldest:
            state = self.topics.get(position.topic)
            if state is not None and state.known and state.last < position.seq - 1:
                self.stats.gaps += 1
                state.last = position.seq - 1
                state.gap_since = None
                self._release(state, now)

    def arrived(self, message: FeedMessage, now: float) -> None:
        state = self.topics.setdefault(message.topic, TopicState())
        if not state.known:
            state.last, state.known = message.seq - 1, True
        if message.seq <= state.last:
            # Sent again: a condition for a late joiner (the present, which we have not
            # had), a republication of what we had, or a duplicate.
            if message.category is not Category.CONDITION:
                self.stats.duplicates += 1
            elif message.seq > state.delivered:
                self._deliver(state, message)
            elif self.skip_repeated_conditions:
                self.stats.repeated_conditions += 1
            else:
                self.ready.append(message)
            return
        state.held[message.seq] = message
        if message.seq > state.last + 1 and state.gap_since is None:
            state.gap_since = state.asked_at = now
            self.ask(now, {message.topic: state.last})  # ask for the missing
        self._release(state, now)

    def _release(self, state: TopicState, now: float) -> None:
        start = state.last
        while state.last + 1 in state.held:
            state.last += 1
            self._deliver(state, state.held.pop(state.last))
        if state.gap_since is None:
            return
        if not state.held:
            self.stats.recovered += 1
            state.gap_since = None
        elif state.last > start:
            state.gap_since = now  # progress: the clock starts again

    def _deliver(self, state: TopicState, message: FeedMessage) -> None:
        state.delivered = max(state.delivered, message.seq)
        if message.category is Category.CONDITION:
            if self.skip_repeated_conditions and state.condition.get(message.kind) == \
                    message.body:
                self.stats.repeated_conditions += 1
                return
            state.condition[message.kind] = message.body
        self.ready.append(message)
