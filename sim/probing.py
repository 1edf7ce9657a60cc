"""The probing attack: a tenant that proposes and withdraws in a loop, scored by the
learned attackers (sim/learned.py's protocol) on what it sees, against the private feed
alone on the same runs.

The prober (the attacker tenant, sim/negotiating.py) proposes, every hour and in every
pool, the most the pool could hold with count flexibility, and rejects the answer at once.
An offer's count is what the engine lets it hold: its share of the latest release's lower
edge, scaled by its own record, less its own holds. The prober sees both its feed and
these answers; each answer is added to its series as a reading of the pool's free GPUs
(the count over its share, its host counts those of the release before it), so the
learners get every answer with the features they already use.

Offers are computed from releases the prober already has and from its own state, so the
answers are post-processing and it must learn nothing more: its score should sit inside
the feed's interval.
"""

from __future__ import annotations

from dataclasses import replace

from sim.engine import Records
from sim.learned import AttackData, LearnedScore, failure_data, load_data, score


def seen_by_prober(records: Records, share: float) -> Records:
    """The attacker's feed with every probe's answer added as a reading, in time order."""
    latest: dict[int, tuple[int, int | None, int, int | None]] = {}
    rows = []
    feed = sorted(records.feed, key=lambda r: r[0])
    probes = sorted(records.probes, key=lambda r: r[0])
    i = 0
    for t, pool, offered in probes:
        while i < len(feed) and feed[i][0] <= t:
            r = feed[i]
            latest[r[1]] = (r[2], r[3], r[4], r[5])
            rows.append(r)
            i += 1
        hosts = latest.get(pool)
        if hosts is None:
            continue
        free = round(offered / share) if share > 0 else 0
        rows.append((t, pool, *hosts, free, free))
    rows.extend(feed[i:])
    return replace(records, feed=rows)


def attack_rows(records: Records, sample_s: float, window_s: float,
                tag: str) -> tuple[AttackData, AttackData]:
    return (load_data(records, sample_s, tag),
            failure_data(records, window_s, sample_s, tag))


def compare(rows_feed: list[tuple[AttackData, AttackData]],
            rows_prober: list[tuple[AttackData, AttackData]],
            repeats: int) -> list[tuple[LearnedScore, LearnedScore]]:
    """Per attack (others' load, a host failed): the feed alone and the prober's view,
    each pooled over the runs by the same protocol."""
    out = []
    for k, name in enumerate(("others' load above median", "a host failed in the window")):
        out.append((score(name, [r[k] for r in rows_feed], repeats=repeats),
                    score(name, [r[k] for r in rows_prober], repeats=repeats)))
    return out
