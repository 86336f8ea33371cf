"""Statistics of k-sample evaluation: Pass@k, Avg@k, Max@k, majority vote, paired bootstrap.

With n samples of a question of which c are correct:

- **Pass@k** (unbiased, Chen et al. 2021): the probability that at least one of k samples drawn without
  replacement from the n is correct,
      pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n - c + 1}^{n} (1 - k / i)
  (1 when n - c < k). The product form never builds the huge binomials. It needs 1 <= k <= n.
  A suite's Pass@k is the mean over questions. (ASearcher's "Max@k" instead runs the eval k times and
  takes the per-question max of the first k runs: `max_at_k`; with n = k and 0/1 scores it equals pass@k.)
- **Avg@k**: the mean over questions of the mean score of that question's samples (ASearcher, MiroThinker
  avg@8, Tongyi's 3 rounds); scores may be fractional (F1).
- **Majority vote** (xBench's maj@n): the most frequent answer among the samples after `normalize`; None
  predictions abstain. Ties go to the answer whose first occurrence comes earliest (xBench draws at random;
  a deterministic rule keeps reports reproducible). The first original prediction of the winning class is
  returned.
- **Paired bootstrap** of a difference between two systems scored on the same questions: the per-question
  differences d_i = a_i - b_i are resampled with replacement `iters` times; the interval is the 2.5th and
  97.5th percentiles of the resampled means (percentile method), the point estimate the mean of d.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from agent.rewards import normalize_answer


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k for one question with n samples, c correct (see the module docstring).

    Raises ValueError unless 0 <= c <= n and 1 <= k <= n."""
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got n={n}, k={k} (draw at least k samples per question)")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def mean_pass_at_k(correct_per_question: Sequence[Sequence[bool]], k: int) -> float:
    """A suite's Pass@k: the mean over questions of `pass_at_k(len(samples), sum(samples), k)`."""
    if not correct_per_question:
        raise ValueError("mean_pass_at_k: no questions")
    return sum(pass_at_k(len(s), sum(bool(x) for x in s), k) for s in correct_per_question) / len(correct_per_question)


def avg_at_k(scores_per_question: Sequence[Sequence[float]]) -> float:
    """Avg@k: the mean over questions of each question's mean sample score.

    Raises ValueError when there are no questions or a question has no samples."""
    if not scores_per_question:
        raise ValueError("avg_at_k: no questions")
    if any(len(s) == 0 for s in scores_per_question):
        raise ValueError("avg_at_k: a question has no samples")
    return sum(sum(s) / len(s) for s in scores_per_question) / len(scores_per_question)


def max_at_k(scores_per_question: Sequence[Sequence[float]], k: int) -> float:
    """ASearcher's Metric.Max@k: the mean over questions of the max of the first k sample scores (questions
    with fewer samples use what they have, as ASearcher does)."""
    if not scores_per_question or any(len(s) == 0 for s in scores_per_question):
        raise ValueError("max_at_k: no questions, or a question without samples")
    if k < 1:
        raise ValueError(f"max_at_k: k must be >= 1, got {k}")
    return sum(max(s[:k]) for s in scores_per_question) / len(scores_per_question)


def majority_vote(predictions: Sequence[str | None],
                  normalize: Callable[[str], str] | None = normalize_answer) -> str | None:
    """The most frequent prediction (the first original string of the winning class), or None when every
    prediction is None. `normalize` maps a prediction to its vote class (default SQuAD normalisation, so
    "The Eiffel Tower" and "eiffel tower" vote together; None: exact strings). Ties: earliest first occurrence."""
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for p in predictions:
        if p is None:
            continue
        key = normalize(p) if normalize is not None else p
        counts[key] = counts.get(key, 0) + 1
        first.setdefault(key, p)
    if not counts:
        return None
    # dicts keep insertion order = order of first occurrence; max() returns the first of equal counts
    winner = max(counts, key=counts.__getitem__)
    return first[winner]


def bootstrap_diff(a: Sequence[float], b: Sequence[float], *, iters: int = 2000,
                   seed: int = 0) -> tuple[float, float, float]:
    """(mean(a - b), lo, hi): the paired difference of per-question scores with a 95% percentile-bootstrap
    interval. `a[i]` and `b[i]` must score the same question; deterministic for a given seed.

    Raises ValueError for empty or unequal-length inputs or iters < 1."""
    if len(a) != len(b):
        raise ValueError(f"bootstrap_diff: paired scores need equal lengths, got {len(a)} and {len(b)}")
    if not a:
        raise ValueError("bootstrap_diff: no questions")
    if iters < 1:
        raise ValueError(f"bootstrap_diff: iters must be >= 1, got {iters}")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    rng = np.random.default_rng(seed)
    means = np.empty(iters)
    for start in range(0, iters, 256):  # chunks bound memory to 256 x n indices for large suites
        stop = min(iters, start + 256)
        idx = rng.integers(0, len(d), size=(stop - start, len(d)))
        means[start:stop] = d[idx].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(d.mean()), float(lo), float(hi)
