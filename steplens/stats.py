"""The statistics of the toolkit, each constant once: the exact sign test, the pairs it needs, t quantiles.

Why a sign test on alternating pairs: docs/COMPARE.md#statistics."""

import math
from typing import Any

ALPHA = 0.05


def sign_test_p(n: int, k: int, chance: float = 0.5, candidates: int = 1) -> float:
    """Exact sign test: candidates x P(X >= k) for X ~ Binomial(n, chance), at most 1.

    One candidate: the one-sided test of a side fixed beforehand. Several: the side (or rank) was picked
    after looking, and each could have reached k (two candidates at chance 1/2: the two-sided test)."""
    tail = sum(math.comb(n, i) * chance**i * (1 - chance) ** (n - i) for i in range(max(k, 0), n + 1))
    return min(1.0, candidates * tail)


def steps_needed(candidates: int, chance: float, alpha: float = ALPHA) -> int:
    """The fewest trials with which p < alpha is reachable at all (every trial on the candidate's side)."""
    n = 0
    while sign_test_p(n, n, chance, candidates) >= alpha:
        n += 1
    return n


def smallest_p(n: int) -> float:
    """The smallest two-sided p the exact sign test (or the exact paired permutation test) can give with n pairs."""
    return sign_test_p(n, n, candidates=2)


def pairs_needed(alpha: float = ALPHA) -> int:
    """The fewest pairs with which p < alpha is reachable at all."""
    n = 0
    while smallest_p(n) >= alpha:
        n += 1
    return n


def sign_test(ratios: list[float]) -> dict[str, Any]:
    """Exact two-sided sign test of "no difference" on paired ratios B/A; ties (exactly 1) are dropped."""
    untied = [r for r in ratios if r != 1]
    n, above = len(untied), sum(r > 1 for r in untied)
    # Two candidates (faster or slower), the side picked by the data: the two-sided test.
    return {
        "pairs": len(ratios),
        "untied": n,
        "above_1": above,
        "below_1": n - above,
        "p": sign_test_p(n, max(above, n - above), candidates=2),
        "smallest_p": smallest_p(n),
        "needed": pairs_needed(),
    }


def significance(test: dict[str, Any], alpha: float = ALPHA) -> str:
    if test["smallest_p"] >= alpha:
        untied = f", {test['untied']} untied" if test["untied"] != test["pairs"] else ""
        return f"too few repeats for a verdict (n={test['pairs']} pairs{untied}, need {test['needed']})"
    if test["p"] < alpha:
        return "faster" if test["above_1"] > test["below_1"] else "slower"
    return "within the noise"


# Two-sided 95% quantiles of Student's t by degrees of freedom, to two decimals (df=2: 4.30 for 4.303, an
# interval at most 0.1% narrower than the exact one).
T975 = {
    1: 12.71,
    2: 4.30,
    3: 3.18,
    4: 2.78,
    5: 2.57,
    6: 2.45,
    7: 2.36,
    8: 2.31,
    9: 2.26,
    10: 2.23,
    12: 2.18,
    15: 2.13,
    20: 2.09,
    30: 2.04,
    60: 2.00,
    120: 1.98,
}


def t975(df: float | None) -> float:
    """The t quantile for a 95% interval; 1.96 when df is unknown or above 120."""
    if df is None or df > max(T975):
        return 1.96
    return T975[max(k for k in T975 if k <= max(1, math.floor(df)))]
