"""Unbiased estimators of pass@k and pass^k from n samples of which c passed."""

from __future__ import annotations

from math import comb


def _check(n: int, c: int, k: int) -> None:
    if n < 0 or c < 0 or c > n:
        raise ValueError(f"need 0 <= c <= n, got n={n} c={c}")
    if k < 1 or k > n:
        raise ValueError(f"need 1 <= k <= n, got k={k} n={n}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k samples drawn without replacement passes) = 1 - C(n-c, k) / C(n, k)."""
    _check(n, c, k)
    return 1.0 - comb(n - c, k) / comb(n, k)


def pass_hat_k(n: int, c: int, k: int) -> float:
    """pass^k: P(all k samples drawn without replacement pass) = C(c, k) / C(n, k)."""
    _check(n, c, k)
    return comb(c, k) / comb(n, k)
