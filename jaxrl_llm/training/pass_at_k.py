"""Sampled-evaluation metrics: pass@k (Chen et al. 2021) and maj@K over K samples per record.

With n samples of a record, c of them correct, the unbiased estimate of the chance that
at least one of k samples drawn without replacement is correct is

  pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{i = n-c+1}^{n} (1 - k / i)

(the product form: no large binomials, Chen et al. 2021, "Evaluating Large Language
Models Trained on Code", fig. 3), averaged over records. maj@K votes: the record counts
as correct when a sample carrying its most frequent answer is correct (answers from a
per-task extractor, `training.answers`; ties go to the answer seen first, and a sample
without an answer (None) never wins).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased pass@k of one record: `n` samples, `c` correct, `k` in [1, n]."""
  if not 1 <= k <= n or not 0 <= c <= n:
    raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n; got n={n}, c={c}, k={k}")
  if n - c < k:  # every draw of k samples holds a correct one
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def pass_at_k_per_record(correct_RK: np.ndarray, k: int) -> np.ndarray:
  """pass@k of each record: float64 [R] from `correct_RK` (bool [R, K], K samples each)."""
  correct_RK = np.asarray(correct_RK, bool)
  n = correct_RK.shape[1]
  return np.asarray([pass_at_k(n, int(c), k) for c in correct_RK.sum(axis=1)], np.float64)


def default_ks(num_samples: int) -> tuple[int, ...]:
  """1, 2, 4, ... up to `num_samples`, and `num_samples` itself (6 -> 1, 2, 4, 6)."""
  if num_samples < 1:
    raise ValueError(f"num_samples={num_samples}: expected >= 1")
  ks = [1 << i for i in range(num_samples.bit_length()) if 1 << i <= num_samples]
  return tuple(ks if ks[-1] == num_samples else ks + [num_samples])


def resolve_ks(pass_k: Sequence[int], num_samples: int, field: str = "config.eval.pass_k"
               ) -> tuple[int, ...]:
  """The k's to report: `pass_k` (each in [1, num_samples], sorted, once each) or, empty,
  `default_ks(num_samples)`; a bad k raises a ValueError naming `field`."""
  if not len(pass_k):
    return default_ks(num_samples)
  bad = [k for k in pass_k if isinstance(k, bool) or not isinstance(k, int)
         or not 1 <= k <= num_samples]
  if bad:
    raise ValueError(f"{field}={tuple(pass_k)}: expected each k an integer in [1, "
                     f"{num_samples}] (the samples per record); {bad[0]!r} is not")
  return tuple(sorted(set(pass_k)))


def majority(answers: Sequence[str | None]) -> str | None:
  """The most frequent answer that is not None (ties: the one seen first); None if none."""
  counts: dict[str, int] = {}
  for a in answers:
    if a is not None:
      counts[a] = counts.get(a, 0) + 1
  if not counts:
    return None
  most = max(counts.values())
  return next(a for a in counts if counts[a] == most)  # dicts keep first-seen order


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
  """maj@K of one record: a sample carrying the majority answer is correct."""
  if len(answers) != len(correct):
    raise ValueError(f"{len(answers)} answers for {len(correct)} samples: expected one each")
  winner = majority(answers)
  return winner is not None and any(bool(c) for a, c in zip(answers, correct) if a == winner)


def summarize(correct_RK: np.ndarray, answers_RK: Sequence[Sequence[str | None]],
              rewards_RK: np.ndarray, ks: Sequence[int]) -> dict[str, float]:
  """One source's sampled metrics over its R records: `pass@k` for each k, `maj@K`, and
  `reward_mean` (the samples' mean reward total)."""
  correct_RK = np.asarray(correct_RK, bool)
  K = correct_RK.shape[1]
  out = {f"pass@{k}": float(pass_at_k_per_record(correct_RK, k).mean()) for k in ks}
  out[f"maj@{K}"] = float(np.mean([majority_correct(a, c)
                                   for a, c in zip(answers_RK, correct_RK)]))
  out["reward_mean"] = float(np.mean(rewards_RK))
  return out
