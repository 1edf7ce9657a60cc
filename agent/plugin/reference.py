"""The plugin's decisions in Python, the oracle the C code is checked against: which
rules a rank follows at a collective index (:func:`evaluate`, :class:`ReferenceContext`)
and what it does to NCCL's cost table (:func:`apply`). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from agent.plugin.policy import MAX_CHANNELS, NCCL_CAP_VERSION, WAIT, Held, Policy, history_step
from agent.plugin.stats import (
    FLAG_DEFERRED,
    FLAG_HELD_PENDING,
    FLAG_LISTED,
    FLAG_MAPPED,
    FLAG_REFUSED,
    StatsSlot,
)


def value(entry: Held, index: int) -> int:
    """The ruleset (hash; 0 NCCL's own) ``entry`` answers at ``index``, or WAIT."""
    if not entry.listed:
        return 0
    if index < entry.at:
        return entry.before
    return WAIT if entry.pending else entry.after


def _same_at(held: Held, new: Held, index: int) -> bool:
    vh, vn = value(held, index), value(new, index)
    if vh != WAIT:
        return vh == vn
    if vn == WAIT:
        return (new.at, new.before, new.after) == (held.at, held.before, held.after)
    return vn in (held.before, held.after)


def _agree(held: Held, new: Held, lo: int, hi: int | None) -> bool:
    return all(_same_at(held, new, p) for p in (lo, held.at, new.at)
               if p >= lo and (hi is None or p < hi))


class Verdict(IntEnum):
    ACCEPT = 0
    DEFER = 1
    REFUSE = 2


def evaluate(held: Held, new: Held, n: int) -> tuple[Verdict, int | None]:
    """Whether a context holding ``held``, about to issue collective ``n``,
    takes ``new`` (and, when deferred, the index at which it looks again).

    The same rule as ``hz_evaluate`` in the plugin: revisions never go back; a
    copy that answers alike from ``n`` on is taken; one that differs only from
    its own ``at`` >= ``n`` on (and beyond the held entry's armed switch, if it
    holds one) is taken; one that could agree once this rank passed its held
    ``at`` waits for that index; anything else is refused.
    """
    if new.revision < held.revision:
        return Verdict.REFUSE, None
    if new.revision == held.revision:
        return (Verdict.ACCEPT if new == held else Verdict.REFUSE), None
    if _agree(held, new, n, None):
        return Verdict.ACCEPT, None
    # A new switch must lie beyond an armed one this rank holds: before it, the armed
    # change's outcome would be decided by nobody.
    if new.at >= n and (not held.pending or new.at > held.at) and _agree(held, new, n, new.at):
        return Verdict.ACCEPT, None
    if held.listed and n < held.at:
        return Verdict.DEFER, held.at
    return Verdict.REFUSE, None


@dataclass
class ReferenceContext:
    """A plugin context as the reference sees it: what it holds, a deferred copy, its
    switch record. ``see()`` a new copy of its entry (taken at its next call, as the
    plugin takes a new seq), then ``call()`` once per collective; a call the plugin
    would wait in (an armed switch reached) must not be made: ``would_wait()`` says."""

    held: Held = field(default_factory=Held)
    cand: Held | None = None
    defer_at: int | None = None
    unseen: Held | None = None
    n: int = 0
    current: int = 0
    switches: int = 0
    last_switch: int = 0
    history: int = 0
    prev_history: int = 0
    refused: int | None = None

    def see(self, copy: Held) -> None:
        self.unseen = copy

    def _judge(self, new: Held, n: int) -> None:
        verdict, retry = evaluate(self.held, new, n)
        if verdict is Verdict.ACCEPT:
            self.held, self.cand, self.defer_at, self.refused = new, None, None, None
        elif verdict is Verdict.DEFER:
            self.cand, self.defer_at, self.refused = new, retry, None
        else:
            self.cand, self.defer_at, self.refused = None, None, new.revision

    def _prepare(self, n: int) -> None:
        if self.unseen is not None:
            new, self.unseen = self.unseen, None
            self._judge(new, n)
        if self.defer_at is not None and self.defer_at <= n and self.cand is not None:
            self._judge(self.cand, n)

    def would_wait(self) -> bool:
        trial = dataclasses.replace(self)
        trial._prepare(self.n)
        return value(trial.held, self.n) == WAIT

    def call(self) -> int:
        """The ruleset (hash) this collective runs with."""
        n = self.n
        self._prepare(n)
        answer = value(self.held, n)
        if answer == WAIT:
            raise RuntimeError(f"the plugin would wait at collective {n}")
        if answer != self.current:
            self.prev_history = self.history
            self.history = history_step(self.history, n, answer)
            self.switches += 1
            self.last_switch = n
            self.current = answer
        self.n = n + 1
        return answer

    def slot(self, pid: int, comm_id: int, n_ranks: int, n_nodes: int,
             policy_file: tuple[int, int] = (0, 0)) -> StatsSlot:
        held = self.held
        flags = (FLAG_MAPPED if policy_file != (0, 0) else 0) | (
            FLAG_LISTED if held.listed else 0) | (FLAG_HELD_PENDING if held.pending else 0) | (
            FLAG_REFUSED if self.refused is not None else 0) | (
            FLAG_DEFERRED if self.defer_at is not None else 0)
        return StatsSlot(pid, comm_id, n_ranks, n_nodes, self.n, flags, held.revision, held.at,
                         held.before, held.after, self.last_switch, self.history,
                         self.prev_history, self.switches, self.refused or 0, policy_file)


def effective_channels(cap: int, n_channels: int, nccl_version: int) -> int:
    """What the plugin leaves in ``*nChannels`` for a rule's cap on an NCCL release."""
    if cap <= 0 or nccl_version < NCCL_CAP_VERSION:
        return n_channels  # 2.22-2.30 use any non-zero value as the count: never touched
    cap = min(cap, MAX_CHANNELS)
    return cap if n_channels <= 0 or n_channels > cap else n_channels


def apply(  # noqa: PLR0917 -- mirrors getCollInfo's arguments
    policy: Policy,
    comm_id: int,
    n: int,
    coll: int,
    nbytes: int,
    table: Sequence[Sequence[float]],
    n_channels: int,
    nccl_version: int = 23203,
) -> tuple[list[list[float]], int]:
    """What the plugin does to NCCL's ``table[algo][proto]`` and channel count
    on collective number ``n`` of ``comm_id``, for a context that took
    ``policy`` (and is not waiting at a pending entry's ``at``).

    Returns new values; the inputs are not modified.
    """
    out = [list(row) for row in table]
    entry = policy.entry(comm_id)
    if entry is None:
        return out, n_channels
    index = entry.after if n >= entry.at else entry.before
    if index is None:
        return out, n_channels
    rule = next((r for r in policy.rulesets[index] if r.matches(coll, nbytes)), None)
    if rule is None:
        return out, n_channels
    num_algo = len(out)
    num_proto = len(out[0]) if out else 0
    for pref in rule.prefs:
        algos = range(num_algo) if pref.algo is None else [pref.algo]
        protos = range(num_proto) if pref.proto is None else [pref.proto]
        best: tuple[int, int] | None = None
        for a in algos:
            for p in protos:
                if a >= num_algo or p >= num_proto:
                    continue
                cost = out[a][p]
                # Negative means NCCL disabled it: never a candidate (NaN neither).
                if cost >= 0 and (best is None or cost < out[best[0]][best[1]]):
                    best = (a, p)
        if best is not None:
            out[best[0]][best[1]] = 0.0
            break
    return out, effective_channels(rule.max_channels, n_channels, nccl_version)

