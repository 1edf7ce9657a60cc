"""Leakage attacks: what one tenant can infer from its own feed about what is hidden from it.

The attacker is a tenant (``SimConfig.attacker``) and uses the publications delivered to
it, nothing else. (Its own load would help too, but not because of the feed: with
jobs given to tenants at random, a tenant's own load rises and falls with everyone's,
and alone predicts the others' load far above chance. Leaving it out keeps the score a
measure of what the feed gives away.) We grant it a strong position: labelled
ground truth for half the days (as if it once colluded with an insider) to fit its
rule, then score the rule on the other half (even days train, odd days test, so the
halves interleave over the whole trace). Scores are *balanced accuracy* (the mean of the
true-positive and true-negative rates), so chance is 0.5 however rare the event.

1. **Other tenants' load.** Every ``sample_s``, per pool: are the GPUs the other tenants
   hold above that pool's median? Feature: the attacker's latest capacity reading. Two
   rules, the better on the training half wins: a threshold on the GPUs in use,
   ``gpus_per_node * hosts_up - available`` (bucket midpoints; exact under the full
   feed), and a lookup table over the (bucketed) readings.
2. **A host failed.** Per pool and ``attack_window_s`` window: did a host of the pool
   fail (stop being plainly healthy) in it? Features from the publications delivered in
   the window: did the published hosts-down count rise, did hosts-up fall, was there any
   update. Rule: a lookup table predicting "failed" where a feature pattern is more
   likely under failure than without (a likelihood-ratio test).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from sim.engine import Records

DAY = 86400.0
MIN_CLASS = 5  # a pool with fewer samples of either class in a half is left out


@dataclass(frozen=True)
class AttackScore:
    attack: str
    accuracy: float | None   # balanced accuracy on the test half (None: not enough events)
    chance: float
    positives: int           # test samples of each class
    negatives: int
    rule: str


def balanced(pred: Sequence[bool], truth: Sequence[bool]) -> float | None:
    pos = sum(1 for t in truth if t)
    neg = len(truth) - pos
    if pos == 0 or neg == 0:
        return None
    tp = sum(1 for p, t in zip(pred, truth, strict=True) if p and t)
    tn = sum(1 for p, t in zip(pred, truth, strict=True) if not p and not t)
    return (tp / pos + tn / neg) / 2


def fit_threshold(values: Sequence[float], truth: Sequence[bool]) -> float:
    """The cut (predict True above it) with the best balanced accuracy on the data."""
    pos = sum(truth)
    neg = len(truth) - pos
    order = sorted(range(len(values)), key=lambda i: values[i])
    # Cut below everything: all predicted True.
    best_cut, best = float("-inf"), 0.5
    tn = fn = 0
    for rank, i in enumerate(order):
        if truth[i]:
            fn += 1
        else:
            tn += 1
        nxt = order[rank + 1] if rank + 1 < len(order) else None
        if nxt is not None and values[nxt] == values[i]:
            continue  # cut only between distinct values
        score = ((pos - fn) / pos + tn / neg) / 2 if pos and neg else 0.5
        if score > best:
            best, best_cut = score, values[i]
    return best_cut


def fit_table(keys: Sequence[Hashable], truth: Sequence[bool]) -> dict[Hashable, bool]:
    """Per key: True where it is more frequent among positives than negatives."""
    pos = sum(truth) or 1
    neg = (len(truth) - sum(truth)) or 1
    counts: dict[Hashable, list[int]] = defaultdict(lambda: [0, 0])
    for k, t in zip(keys, truth, strict=True):
        counts[k][0 if t else 1] += 1
    return {k: c[0] / pos > c[1] / neg for k, c in counts.items()}


def _mid(lo: int, hi: int | None) -> float:
    return lo if hi is None else (lo + hi) / 2


def load_attack(records: Records, gpus_per_node: int) -> AttackScore:
    by_pool: dict[int, list[tuple[float, int, int, tuple[int, int | None, int, int | None] | None]]]
    by_pool = defaultdict(list)
    for t, pool, others, own, view in records.samples:
        by_pool[pool].append((t, others, own, view))
    preds: list[bool] = []
    truth: list[bool] = []
    rules: dict[str, int] = defaultdict(int)
    for rows in by_pool.values():
        loads = sorted(r[1] for r in rows)
        median = loads[len(loads) // 2]
        train, test = [], []
        for t, others, _own, view in rows:
            est = (float("-inf") if view is None else
                   gpus_per_node * _mid(view[0], view[1]) - _mid(view[2], view[3]))
            key = None if view is None else (view[0], view[2])
            sample = (est, key, others > median)
            (train if int(t // DAY) % 2 == 0 else test).append(sample)
        ytrain = [s[2] for s in train]
        ytest = [s[2] for s in test]
        if min(sum(ytrain), len(ytrain) - sum(ytrain),
               sum(ytest), len(ytest) - sum(ytest)) < MIN_CLASS:
            continue
        cut = fit_threshold([s[0] for s in train], ytrain)
        table = fit_table([s[1] for s in train], ytrain)
        by_cut = balanced([s[0] > cut for s in train], ytrain) or 0.5
        by_table = balanced([table.get(s[1], False) for s in train], ytrain) or 0.5
        if by_cut >= by_table:
            rules["threshold"] += 1
            preds += [s[0] > cut for s in test]
        else:
            rules["table"] += 1
            preds += [table.get(s[1], False) for s in test]
        truth += ytest
    pos = sum(truth)
    rule = ", ".join(f"{k} in {v} pools" for k, v in sorted(rules.items())) or "no pool"
    return AttackScore("others' load above median", balanced(preds, truth), 0.5, pos,
                       len(truth) - pos, rule)


def failure_attack(records: Records, window: float) -> AttackScore:
    windows = int(records.horizon // window) + 1
    feed_by_pool: dict[int, list[tuple[float, int, int, int]]] = defaultdict(list)
    for t, pool, up, down, gpus in records.feed:
        feed_by_pool[pool].append((t, up, down, gpus))
    train_k: list[Hashable] = []
    train_y: list[bool] = []
    test_k: list[Hashable] = []
    test_y: list[bool] = []
    for pool in range(len(records.pools)):
        failed = [False] * windows
        for t in records.failures[pool]:
            w = int(t // window)
            if w < windows:
                failed[w] = True
        rises = [False] * windows
        falls = [False] * windows
        updates = [False] * windows
        last: tuple[int, int] | None = None
        for t, up, down, _ in feed_by_pool.get(pool, []):
            w = int(t // window)
            if w < windows:
                updates[w] = True
                if last is not None:
                    rises[w] |= down > last[1]
                    falls[w] |= up < last[0]
            last = (up, down)
        for w in range(windows):
            key = (rises[w], falls[w], updates[w])
            if int(w * window // DAY) % 2 == 0:
                train_k.append(key)
                train_y.append(failed[w])
            else:
                test_k.append(key)
                test_y.append(failed[w])
    table = fit_table(train_k, train_y)
    preds = [table.get(k, False) for k in test_k]
    pos = sum(test_y)
    flagged = sorted(str(k) for k, v in table.items() if v)
    return AttackScore("a host failed in the window", balanced(preds, test_y), 0.5, pos,
                       len(test_y) - pos,
                       "flags (rise, fall, update) in " + (", ".join(flagged) or "nothing"))
