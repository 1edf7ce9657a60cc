"""Learned leakage attacks: what one tenant can infer from the whole time series of its feed.

The attacker is a tenant (``SimConfig.attacker``) and uses only the pool publications
delivered to it. It is granted labelled ground truth for the first half of each run (as
if it once colluded with an insider), learns from it, and is scored on the second half:
training and test spans are disjoint in time, a day apart, so no window of one overlaps
the other. How it learns and is scored (two learners, repeats, balanced accuracy, a
bootstrap over days, the runs pooled in an order fixed by their contents) is
:mod:`sim.learner`.

1. **Other tenants' load.** Every ``sample_s`` (thinned to one an hour), per pool: are
   the GPUs the other tenants hold above that pool's median over the span (training or
   test) the sample is in?
   Features: the pool (one-hot: the label is a median split per pool, meant to leave the
   pool alone predicting nothing; it does predict where a pool's load sits at its median
   much of the time, which is why chance is measured, sim.evaluation), the attacker's
   latest reading of free GPUs, hosts up and hosts down at this and the five previous
   samples (each the middle of the published range,
   and less the pool's mean reading over the training span), and how many updates came
   in the last hour and how old the latest one is.
2. **A host failed.** Per pool and ``attack_window_s`` window: did a host of the pool
   fail (stop being plainly healthy) in it? Features: the readings at every ``sample_s``
   from one window before to one window after (the attacker may wait for the next
   release), less the pool's training mean, and the number of updates in each of the
   three windows. No pool identity: a pool's base rate of failures is not what the feed
   gives away. Negative windows are thinned at random to :data:`NEGATIVES_PER_POSITIVE`
   per positive, which leaves each class's rates, and so balanced accuracy, unbiased.
"""

from __future__ import annotations

import random

import numpy as np

from sim.engine import Records
from sim.learner import (  # noqa: F401 - the attacks' public names, from one place
    MIN_POSITIVES,
    REPEATS,
    AttackData,
    LearnedScore,
    balanced,
    canonical,
    score,
)

DAY = 86400.0
#: The train and test spans are this far apart (seconds) around the middle of a run.
GAP = DAY
NEGATIVES_PER_POSITIVE = 20
#: Load samples kept per run (hourly, then thinned at random to at most this many).
LOAD_ROWS = 6000
LOAD_LAGS = 6


# --- the attacker's feed as series -------------------------------------------------------

def _series(records: Records) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per pool: the times of the attacker's readings and their values (free GPUs, hosts
    up, hosts down; each the middle of the published range, its lower edge if open)."""
    by_pool: dict[int, list[tuple[float, float, float, float]]] = {}
    for t, pool, up_lo, up_hi, down_lo, down_hi, g_lo, g_hi in records.feed:
        by_pool.setdefault(pool, []).append(
            (t, _mid(g_lo, g_hi), _mid(up_lo, up_hi), _mid(down_lo, down_hi)))
    out = {}
    for pool, rows in by_pool.items():
        arr = np.asarray(rows, dtype=np.float64)
        out[pool] = (arr[:, 0], arr[:, 1:])
    return out


def _mid(lo: int, hi: int | None) -> float:
    return float(lo) if hi is None else (lo + hi) / 2.0


def _at(series: tuple[np.ndarray, np.ndarray] | None, when: np.ndarray) -> np.ndarray:
    """The latest reading at or before each time (NaN before the first)."""
    out = np.full((len(when), 3), np.nan, dtype=np.float64)
    if series is None:
        return out
    times, values = series
    idx = np.searchsorted(times, when, side="right") - 1
    ok = idx >= 0
    out[ok] = values[idx[ok]]
    return out


def _count(series: tuple[np.ndarray, np.ndarray] | None, lo: np.ndarray,
           hi: np.ndarray) -> np.ndarray:
    if series is None:
        return np.zeros(len(lo))
    times = series[0]
    return (np.searchsorted(times, hi, side="left")
            - np.searchsorted(times, lo, side="left")).astype(np.float64)


def _spans(t: np.ndarray, horizon: float) -> tuple[np.ndarray, np.ndarray]:
    half = horizon / 2
    return t < half - GAP / 2, t >= half + GAP / 2


def _train_mean(series: tuple[np.ndarray, np.ndarray] | None, horizon: float) -> np.ndarray:
    if series is None:
        return np.zeros(3)
    times, values = series
    early = values[times < horizon / 2 - GAP / 2]
    return early.mean(axis=0) if len(early) else np.zeros(3)


# --- the two attacks' rows ---------------------------------------------------------------

def load_data(records: Records, sample_s: float, seed: str) -> AttackData:
    series = _series(records)
    npools = len(records.pools)
    step = max(1, round(3600.0 / sample_s))
    rows = records.samples[::step]
    t = np.array([r[0] for r in rows], dtype=np.float64)
    pool = np.array([r[1] for r in rows], dtype=np.int64)
    others = np.array([r[2] for r in rows], dtype=np.float64)
    train, test = _spans(t, records.horizon)
    y = np.zeros(len(rows), dtype=bool)
    feats = np.full((len(rows), npools + 3 * LOAD_LAGS + 2), np.nan, dtype=np.float32)
    for p in range(npools):
        here = pool == p
        if not here.any():
            continue
        # The median of the row's own span, so that each pool's rows are balanced in
        # both: a pool's level alone (or a drift between the spans) predicts nothing.
        for span in (train, test):
            rows_here = here & span
            if rows_here.any():
                y[rows_here] = others[rows_here] > float(np.median(others[rows_here]))
        s = series.get(p)
        mean = _train_mean(s, records.horizon)
        tp = t[here]
        block = [_at(s, tp - lag * sample_s) - mean for lag in range(LOAD_LAGS)]
        onehot = np.zeros((here.sum(), npools))
        onehot[:, p] = 1.0
        age = np.full(here.sum(), np.nan)
        if s is not None:
            idx = np.searchsorted(s[0], tp, side="right") - 1
            ok = idx >= 0
            age[ok] = tp[ok] - s[0][idx[ok]]
        feats[here] = np.column_stack(
            [onehot, *block, _count(s, tp - 3600.0, tp + 1e-6), age]).astype(np.float32)
    keep = np.nonzero(train | test)[0]
    if len(keep) > LOAD_ROWS:
        rng = random.Random(f"{seed}:load-rows")
        keep = np.array(sorted(rng.sample(list(keep), LOAD_ROWS)))
    return AttackData(feats[keep], y[keep], train[keep], test[keep],
                      (t[keep] // DAY).astype(np.int64), npools)


def failure_data(records: Records, window: float, sample_s: float, seed: str) -> AttackData:
    series = _series(records)
    windows = int(records.horizon // window)
    points = np.arange(-window, 2 * window + 1e-6, sample_s)
    rng = random.Random(f"{seed}:failure-rows")
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    ts: list[np.ndarray] = []
    for p in range(len(records.pools)):
        failed = np.zeros(windows, dtype=bool)
        for ft in records.failures[p]:
            w = int(ft // window)
            if w < windows:
                failed[w] = True
        start = np.arange(windows) * window
        train, test = _spans(start + window / 2, records.horizon)
        # All positives, and NEGATIVES_PER_POSITIVE negatives per positive of each span.
        chosen: list[int] = []
        for span in (train, test):
            pos = np.nonzero(span & failed)[0].tolist()
            neg = np.nonzero(span & ~failed)[0].tolist()
            take = min(len(neg), max(NEGATIVES_PER_POSITIVE * len(pos), 50))
            chosen += pos + rng.sample(neg, take)
        if not chosen:
            continue
        w = np.array(sorted(chosen))
        s = series.get(p)
        mean = _train_mean(s, records.horizon)
        w0 = start[w]
        grid = [_at(s, w0 + off) - mean for off in points]
        counts = [_count(s, w0 + k * window, w0 + (k + 1) * window) for k in (-1, 0, 1)]
        xs.append(np.column_stack([*grid, *counts]).astype(np.float32))
        ys.append(failed[w])
        ts.append(w0 + window / 2)
    if not xs:
        width = 3 * len(points) + 3
        return AttackData(np.zeros((0, width), np.float32), np.zeros(0, bool),
                          np.zeros(0, bool), np.zeros(0, bool), np.zeros(0, np.int64), 0)
    t = np.concatenate(ts)
    train, test = _spans(t, records.horizon)
    return AttackData(np.concatenate(xs), np.concatenate(ys), train, test,
                      (t // DAY).astype(np.int64), 0)
