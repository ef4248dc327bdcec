"""Shared helpers of the Python package's tests.

Reference values come from NumPy in float64 or from PyTorch's own modules; tolerances for
float32 sums are derived, not tuned: a sum of n float32 terms computed in any order differs
from the exact sum by at most gamma(n) * sum(|term|), gamma(n) = n * eps / (1 - n * eps).
"""

import numpy as np

EPS32 = float(np.finfo(np.float32).eps) / 2  # unit roundoff of float32


def sum_bound(abs_sum: np.ndarray, terms: np.ndarray) -> np.ndarray:
    """Error bound of float32 sums of `terms` values whose magnitudes add up to `abs_sum`.

    One more rounding covers the dropout scale applied to each term before the sum.
    """
    n = np.asarray(terms, dtype=np.float64) + 1
    gamma = n * EPS32 / (1 - n * EPS32)
    return gamma * abs_sum


def add_rows(rows: np.ndarray, ids: np.ndarray, values: np.ndarray) -> None:
    """rows[ids[i]] += values[i] in float64: the reference gradient of a gather."""
    np.add.at(rows, ids.reshape(-1), values.reshape(-1, values.shape[-1]))


def adamw_losses(model, batches, vocab, **adamw):
    """The cross-entropy loss of each (inputs, targets) batch, one AdamW step after each."""
    import torch  # here, so that the NumPy-only tests need no torch
    from torch.nn import functional as F

    opt = torch.optim.AdamW(model.parameters(), **adamw)
    losses = []
    for x, y in batches:
        loss = F.cross_entropy(model(x).reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
