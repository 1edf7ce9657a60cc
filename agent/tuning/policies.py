"""The named choices a job's declaration allows, as concrete tuner rules.

From a :class:`JobDeclaration` every host derives the same three choices,
ordered by how congested the job's network is:

* ``default`` (severity 0): no rules; NCCL's own choice, untouched.
* ``congested`` (severity 1) and ``severe`` (severity 2): for the
  bandwidth-bound part of each declared size band (messages of at least
  :data:`BANDWIDTH_BOUND`), prefer the declared protocols with the least wire
  overhead and cap the channel count at ``max_channels >> severity`` (clamped
  into the declared range).

Why these two levers (the only ones a tuner may move in a running job, see
``research/nccl.md`` §1 and §3): on a congested link the bytes a protocol puts
on the wire per byte of payload cost throughput directly. LL sends an 8-byte
flag with every 8 bytes of data (half the link is overhead), LL128 120 of
every 128 bytes, Simple almost none; LL's advantage, latency, does not matter
once a message is large enough to be bandwidth-bound. Fewer channels mean
fewer concurrent connections and less data in flight competing at the
bottleneck queue, which shortens the queue the job's own collectives (and its
bulk floor) wait behind, while the link stays full. Latency-bound messages
barely load a link, so they are left to NCCL, as is everything a declaration
does not cover.

Everything here is a pure function of the declaration: two hosts given the
same declaration produce byte-identical rules (:attr:`Derivation.fingerprint`),
which is what lets a multi-host job switch by name at an agreed collective.
Rules never leave the declaration: only listed collectives, algorithms and
protocols, channels within ``[min_channels, max_channels]``, sizes within
the declared band.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

from agent.plugin.layout import (
    MAX_PREFS,
    MAX_RULES,
    MAX_RULESETS,
    RULESETS_OFFSET,
    Algo,
    Coll,
    Policy,
    Pref,
    Proto,
    Rule,
    encode_policy,
)
from harmonaize.messages import (
    Algorithm,
    Collective,
    JobDeclaration,
    Protocol,
    TuningRange,
)

DEFAULT, CONGESTED, SEVERE = "default", "congested", "severe"
#: Choice names by severity (0: calm, 1: congested, 2: heavily congested).
CHOICE_NAMES = (DEFAULT, CONGESTED, SEVERE)
#: Messages from this size on are bandwidth-bound on any data-center link
#: (1 MiB takes ~20 us at 400 Gb/s, well above a collective's few-us latency).
BANDWIDTH_BOUND = 1 << 20

_COLLS = {
    Collective.BROADCAST: Coll.BROADCAST,
    Collective.REDUCE: Coll.REDUCE,
    Collective.ALLGATHER: Coll.ALL_GATHER,
    Collective.REDUCESCATTER: Coll.REDUCE_SCATTER,
    Collective.ALLREDUCE: Coll.ALL_REDUCE,
}
_ALGOS = {
    Algorithm.TREE: Algo.TREE,
    Algorithm.RING: Algo.RING,
    Algorithm.COLLNET_DIRECT: Algo.COLLNET_DIRECT,
    Algorithm.COLLNET_CHAIN: Algo.COLLNET_CHAIN,
    Algorithm.NVLS: Algo.NVLS,
    Algorithm.NVLS_TREE: Algo.NVLS_TREE,
    Algorithm.PAT: Algo.PAT,
}
_PROTOS = {Protocol.LL: Proto.LL, Protocol.LL128: Proto.LL128, Protocol.SIMPLE: Proto.SIMPLE}
#: Least wire overhead first (Simple ~0%, LL128 ~6%, LL 50%).
WIRE_EFFICIENCY = (Protocol.SIMPLE, Protocol.LL128, Protocol.LL)


def choice_name(severity: int) -> str:
    return CHOICE_NAMES[max(0, min(len(CHOICE_NAMES) - 1, severity))]


def severity_of(name: str) -> int:
    try:
        return CHOICE_NAMES.index(name)
    except ValueError:
        raise ValueError(f"unknown choice {name!r}; choices are {', '.join(CHOICE_NAMES)}") \
            from None


@dataclass(frozen=True)
class Choice:
    name: str
    severity: int
    #: The ruleset the plugin follows under this choice; empty: NCCL's own choice.
    rules: tuple[Rule, ...]
    summary: str


@dataclass(frozen=True)
class Derivation:
    """Every choice of one declaration (one revision of it)."""

    job: str
    revision: int
    choices: tuple[Choice, ...]
    #: Parts of the declaration left to NCCL, and why.
    notes: tuple[str, ...] = ()

    def get(self, name: str) -> Choice:
        return self.choices[severity_of(name)]

    @property
    def tunable(self) -> bool:
        """Whether any choice changes anything (a declaration without ranges does not)."""
        return any(choice.rules for choice in self.choices)

    @functools.cached_property
    def fingerprint(self) -> str:
        """Digest of the encoded rules of every choice, as the plugin reads them."""
        image = encode_policy(Policy(0, rulesets=tuple(c.rules for c in self.choices)))
        return hashlib.sha256(image[RULESETS_OFFSET:]).hexdigest()[:16]


def _prefs(band: TuningRange) -> tuple[Pref, ...]:
    """Declared protocols by wire efficiency, each with the declared algorithms in the
    tenant's order (or any algorithm, if all are declared), at most MAX_PREFS."""
    algos: list[Algo | None] = (
        [None] if len(set(band.algorithms)) == len(_ALGOS)
        else [_ALGOS[a] for a in band.algorithms])
    prefs = [Pref(algo, _PROTOS[proto])
             for proto in WIRE_EFFICIENCY if proto in band.protocols
             for algo in algos]
    return tuple(prefs[:MAX_PREFS])


def channel_cap(band: TuningRange, severity: int) -> int:
    """Fewer channels the more congested, never outside the declared range."""
    return max(band.min_channels, min(band.max_channels, band.max_channels >> severity))


def _rules(declaration: JobDeclaration, severity: int) -> tuple[tuple[Rule, ...], list[str]]:
    rules: list[Rule] = []
    notes: list[str] = []
    for i, band in enumerate(declaration.tuning):
        low = max(band.min_bytes, BANDWIDTH_BOUND)
        high = band.max_bytes - 1  # declared bands are half-open, rules inclusive
        if low > high:
            notes.append(f"range {i}: below {BANDWIDTH_BOUND} bytes (latency-bound), "
                         "left to NCCL")
            continue
        if len(rules) == MAX_RULES:
            notes.append(f"range {i}: beyond the {MAX_RULES} rules a policy holds, "
                         "left to NCCL")
            continue
        rules.append(Rule(
            colls=frozenset(_COLLS[c] for c in band.collectives),
            min_bytes=low,
            max_bytes=high,
            prefs=_prefs(band),
            max_channels=channel_cap(band, severity),
        ))
    return tuple(rules), notes


_SUMMARIES = (
    "NCCL's own choice, untouched",
    "bandwidth-bound sizes: least-overhead declared protocol, at most half the channels",
    "bandwidth-bound sizes: least-overhead declared protocol, at most a quarter of the channels",
)


def derive(declaration: JobDeclaration) -> Derivation:
    """The choices ``declaration`` allows; a pure, deterministic function."""
    choices = [Choice(DEFAULT, 0, (), _SUMMARIES[0])]
    notes: list[str] = []
    for severity in (1, 2):
        rules, found = _rules(declaration, severity)
        choices.append(Choice(CHOICE_NAMES[severity], severity, rules, _SUMMARIES[severity]))
        notes = found  # the same bands are skipped at every severity
    if not declaration.tuning:
        notes = ["no tuning ranges declared: NCCL's own choices throughout"]
    assert len(choices) <= MAX_RULESETS
    return Derivation(declaration.job, declaration.revision, tuple(choices), tuple(notes))


def describe_rule(rule: Rule) -> dict[str, object]:
    """A rule in the tenant's vocabulary, for operators."""
    algos = {v: k.value for k, v in _ALGOS.items()}
    protos = {v: k.value for k, v in _PROTOS.items()}
    colls = {v: k.value for k, v in _COLLS.items()}
    return {
        "collectives": sorted(colls[c] for c in rule.colls),
        "min_bytes": rule.min_bytes,
        "max_bytes": rule.max_bytes,
        "prefer": [f"{'any' if p.algo is None else algos[p.algo]}/"
                   f"{'any' if p.proto is None else protos[p.proto]}" for p in rule.prefs],
        "max_channels": rule.max_channels,
    }
