"""The attacks' learning protocol: pooled runs, two learners, repeats, and the score.

Each run's rows (:class:`AttackData`, built by sim.learned from the attacker's feed) are
split by time: the first half of the run trains, the second half tests. Two learners from
scikit-learn compete, gradient boosting (``HistGradientBoostingClassifier``) and logistic
regression, both with balanced class weights; the one with the better balanced accuracy
on the last quarter of the training spans is refitted on all of them and scored once on
the test spans. The score is *balanced accuracy* (the mean of the true-positive and
true-negative rates) and the 95% interval a bootstrap over whole days of the test spans.

The protocol is fixed, so a score does not depend on how the runs were gathered: the
runs are put in a canonical order (by a digest of their rows) before pooling, each run's
split is its own (first half trains, second half tests), and the whole protocol is
repeated :data:`REPEATS` times, each with its own shuffle of the training rows and its
own learner seed. The score is the mean balanced accuracy over the repeats; the spread
(lowest and highest repeat) says how much it owes to the learner's luck, the 95% interval
how much to the test days drawn. A repeat whose learner predicts one class on the whole
test span scores exactly 0.5 and is counted as *collapsed*: such a score says the
learner found nothing to separate, not that the feed is private. Chance is not assumed:
the evaluation (sim.evaluation) scores the same protocol on the no-feed regime's rows
and reports that as the chance level.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: An estimate rests on at least this many positive test windows to count.
MIN_POSITIVES = 200
BOOTSTRAP = 400
#: Repeats of the whole training protocol (shuffle and learner seed each).
REPEATS = 5


@dataclass(frozen=True, eq=False)
class AttackData:
    """One run's rows for one attack: features, labels, and where each row lies in time."""

    x: np.ndarray        # float32, NaN where the attacker had no reading yet
    y: np.ndarray        # bool
    train: np.ndarray    # bool: in the training span
    test: np.ndarray     # bool: in the test span
    day: np.ndarray      # int: the row's day (bootstrap blocks)
    pools: int           # one-hot width at the front of x (0: none)

    def __eq__(self, other: object) -> bool:  # arrays compare whole, NaN equal to NaN
        if not isinstance(other, AttackData):
            return NotImplemented
        return self.pools == other.pools and np.array_equal(self.x, other.x, equal_nan=True) \
            and all(np.array_equal(getattr(self, f), getattr(other, f))
                    for f in ("y", "train", "test", "day"))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True)
class LearnedScore:
    attack: str
    accuracy: float          # balanced accuracy on the pooled test spans, mean of repeats
    low: float               # 95% bootstrap interval (over days)
    high: float
    chance: float            # 0.5 unless measured (sim.evaluation: the no-feed regime)
    positives: int           # test rows of each class
    negatives: int
    model: str
    runs: int
    repeats: int = 1
    #: The lowest and highest repeat's balanced accuracy.
    spread_low: float = 0.5
    spread_high: float = 0.5
    #: Repeats whose learner predicted one class on the whole test span.
    collapsed: int = 0

    @property
    def enough(self) -> bool:
        return self.positives >= MIN_POSITIVES

    @property
    def is_collapsed(self) -> bool:
        """Every repeat predicted one class: no estimate of privacy, a learner that failed."""
        return self.repeats > 0 and self.collapsed >= self.repeats

    def text(self) -> str:
        if self.is_collapsed:
            return (f"collapsed: the learner predicts one class ({self.positives} positive "
                    f"test windows, {self.model})")
        note = "" if self.enough else f", under {MIN_POSITIVES} positives: not an estimate"
        some = f", {self.collapsed} of {self.repeats} repeats collapsed" if self.collapsed else ""
        return (f"{self.accuracy:.2f} [{self.low:.2f}, {self.high:.2f}] repeats "
                f"{self.spread_low:.2f}-{self.spread_high:.2f} (chance {self.chance:.2f}; "
                f"{self.positives} positive test windows, {self.model}{some}{note})")


def balanced(pred: np.ndarray, truth: np.ndarray) -> float | None:
    pos = int(truth.sum())
    neg = len(truth) - pos
    if pos == 0 or neg == 0:
        return None
    tpr = float((pred & truth).sum()) / pos
    tnr = float((~pred & ~truth).sum()) / neg
    return (tpr + tnr) / 2


def _models(seed: int) -> dict[str, object]:
    from sklearn.ensemble import HistGradientBoostingClassifier  # noqa: PLC0415
    from sklearn.impute import SimpleImputer  # noqa: PLC0415
    from sklearn.linear_model import LogisticRegression  # noqa: PLC0415
    from sklearn.pipeline import make_pipeline  # noqa: PLC0415
    from sklearn.preprocessing import StandardScaler  # noqa: PLC0415

    return {
        "gradient boosting": HistGradientBoostingClassifier(
            max_iter=150, learning_rate=0.1, class_weight="balanced", random_state=seed),
        "logistic regression": make_pipeline(
            SimpleImputer(strategy="constant", fill_value=0.0, keep_empty_features=True),
            StandardScaler(), LogisticRegression(class_weight="balanced", max_iter=2000)),
    }


def score(name: str, runs: Sequence[AttackData], seed: int = 1,
          repeats: int = REPEATS) -> LearnedScore:
    """Train on every run's training span, test on every run's test span, pooled; the
    protocol repeated ``repeats`` times (module docstring). The runs' order is irrelevant.

    The learners run on one thread: the simulator forks worker processes, and an OpenMP
    runtime that has started threads does not survive a fork (the child hangs).
    """
    from threadpoolctl import threadpool_limits  # noqa: PLC0415 - scikit-learn's own

    with threadpool_limits(limits=1):
        return _score(name, canonical(runs), seed, max(1, repeats))


def canonical(runs: Sequence[AttackData]) -> list[AttackData]:
    """The runs with rows, in an order fixed by their contents (not by who gathered them)."""
    def digest(r: AttackData) -> str:
        h = hashlib.sha256()
        for part in (r.x, r.y, r.train, r.test, r.day):
            h.update(np.ascontiguousarray(part).tobytes())
        return h.hexdigest()

    return sorted((r for r in runs if len(r.y)), key=digest)


def _score(name: str, runs: list[AttackData], seed: int, repeats: int) -> LearnedScore:
    if not runs:
        return LearnedScore(name, 0.5, 0.5, 0.5, 0.5, 0, 0, "no data", 0)
    x = np.concatenate([r.x for r in runs])
    empty = np.isnan(x).all(axis=0)
    x[:, empty] = 0.0  # a feature never seen carries nothing (and trips the binning)
    y = np.concatenate([r.y for r in runs])
    train = np.concatenate([r.train for r in runs])
    test = np.concatenate([r.test for r in runs])
    # Bootstrap blocks: (run, day), the run by its place in the canonical order.
    block = np.concatenate([r.day * 1000 + i for i, r in enumerate(runs)])
    # The last quarter of each run's training span validates the choice of learner.
    late = np.concatenate([_late(r) for r in runs])
    ytest = y[test]
    pos, neg = int(ytest.sum()), int((~ytest).sum())
    ytrain = y[train]
    if ytrain.all() or not ytrain.any() or pos == 0 or neg == 0:
        return LearnedScore(name, 0.5, 0.5, 0.5, 0.5, pos, neg, "one class only", len(runs))
    votes = np.zeros(int(test.sum()), dtype=np.int64)  # repeats predicting positive, per row
    accs: list[float] = []
    chosen: list[str] = []
    collapsed = 0
    data = _Pooled(x, y, train, test, late)
    for k in range(repeats):
        pred, label = _one_repeat(data, seed, k)
        if pred.all() or not pred.any():
            collapsed += 1
        votes += pred
        accs.append(balanced(pred, ytest) or 0.5)
        chosen.append(label)
    low, high = _bootstrap(votes, repeats, ytest, block[test], seed)
    models = ", ".join(f"{m} x{chosen.count(m)}" for m in sorted(set(chosen)))
    return LearnedScore(name, float(np.mean(accs)), low, high, 0.5, pos, neg, models,
                        len(runs), repeats, min(accs), max(accs), collapsed)


@dataclass(frozen=True)
class _Pooled:
    x: np.ndarray
    y: np.ndarray
    train: np.ndarray
    test: np.ndarray
    late: np.ndarray


def _one_repeat(data: _Pooled, seed: int, k: int) -> tuple[np.ndarray, str]:
    """One application of the protocol: the training rows shuffled by repeat ``k``, both
    learners seeded by it; the better on the late training rows refitted on all of them."""
    x, y, train, test, late = data.x, data.y, data.train, data.test, data.late
    rng = np.random.Generator(np.random.PCG64([seed, k]))
    rows = rng.permutation(np.nonzero(train)[0])
    fit = rows[~late[rows]]
    check = rows[late[rows]]
    state = seed * 1000 + k
    best, chosen = -1.0, ""
    for label, model in _models(state).items():
        if y[fit].all() or not y[fit].any() or not len(check):
            acc = 0.0
        else:
            model.fit(x[fit], y[fit])  # type: ignore[attr-defined]
            acc = balanced(model.predict(x[check]).astype(bool),  # type: ignore[attr-defined]
                           y[check]) or 0.5
        if acc > best:
            best, chosen = acc, label
    model = _models(state)[chosen]
    model.fit(x[rows], y[rows])  # type: ignore[attr-defined]
    return model.predict(x[test]).astype(bool), chosen  # type: ignore[attr-defined]


def _late(r: AttackData) -> np.ndarray:
    if not r.train.any():
        return np.zeros(len(r.y), dtype=bool)
    days = r.day[r.train]
    cut = days.min() + 0.75 * (days.max() - days.min())
    return r.train & (r.day >= cut)


def _bootstrap(votes: np.ndarray, repeats: int, truth: np.ndarray, block: np.ndarray,
               seed: int) -> tuple[float, float]:
    """95% percentile interval of the repeats' mean balanced accuracy, resampling whole
    blocks (days). ``votes``: per test row, how many repeats predicted positive; summed
    counts give the mean of the repeats' balanced accuracies (each has the same classes)."""
    blocks, inverse = np.unique(block, return_inverse=True)
    nb = len(blocks)
    t = truth.astype(float)
    tp = np.bincount(inverse, weights=t * votes, minlength=nb)
    pos = np.bincount(inverse, weights=t * repeats, minlength=nb)
    tn = np.bincount(inverse, weights=(1.0 - t) * (repeats - votes), minlength=nb)
    neg = np.bincount(inverse, weights=(1.0 - t) * repeats, minlength=nb)
    rng = np.random.Generator(np.random.PCG64(seed))
    draws = rng.integers(0, nb, size=(BOOTSTRAP, nb))
    counts = np.stack([np.bincount(d, minlength=nb) for d in draws])
    p, n = counts @ pos, counts @ neg
    ok = (p > 0) & (n > 0)
    accs = ((counts @ tp)[ok] / p[ok] + (counts @ tn)[ok] / n[ok]) / 2
    if not len(accs):
        return 0.5, 0.5
    lo, hi = np.percentile(accs, [2.5, 97.5])
    return float(lo), float(hi)
