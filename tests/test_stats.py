"""steplens.stats against values worked out by hand: binomial tails as fractions of 2^n, and Student's t
quantiles from a printed table (four decimals, here rounded to two)."""

import pytest

from steplens import stats


def test_the_sign_test_tail_is_the_binomial_tail_times_the_candidates_at_most_1():
    assert stats.sign_test_p(6, 6) == pytest.approx(1 / 64)
    assert stats.sign_test_p(6, 5) == pytest.approx(7 / 64)  # 6 + 1 of 64
    assert stats.sign_test_p(6, 5, candidates=2) == pytest.approx(14 / 64)
    assert stats.sign_test_p(3, 3, chance=0.25) == pytest.approx(1 / 64)
    assert stats.sign_test_p(3, 2, chance=0.25) == pytest.approx(3 * 3 / 64 + 1 / 64)
    assert stats.sign_test_p(2, 2, candidates=3) == pytest.approx(0.75), "not capped below 1"
    assert stats.sign_test_p(2, 1, candidates=3) == 1.0, "3 x 0.75 is capped at 1"
    assert stats.sign_test_p(4, 0) == 1.0 and stats.sign_test_p(4, -2) == 1.0, "k at or below 0: every outcome"
    assert stats.sign_test_p(3, 3, chance=1.0) == 1.0, "a side that always wins (no term past n, no 0 ** -1)"
    assert stats.sign_test_p(4, 5) == 0.0, "more successes than trials cannot happen"


def test_steps_needed_is_the_fewest_trials_that_can_reach_alpha():
    assert stats.steps_needed(1, 0.5) == 5  # 1/32 < 0.05, 1/16 is not
    assert stats.steps_needed(2, 0.5) == 6  # 2/64 < 0.05, 2/32 is not
    assert stats.steps_needed(3, 1 / 3) == 4  # 3/81 < 0.05, 3/27 is not
    assert stats.steps_needed(1, 0.5, alpha=1 / 16) == 5, "p equal to alpha is not below it"
    assert stats.steps_needed(1, 0.5, alpha=1.5) == 0, "with alpha above 1, no trial is needed"


def test_the_smallest_two_sided_p_and_the_pairs_it_needs():
    assert [stats.smallest_p(n) for n in range(7)] == pytest.approx([1.0, 1.0, 0.5, 0.25, 1 / 8, 1 / 16, 1 / 32])
    assert stats.ALPHA == 0.05 and stats.pairs_needed() == 6
    assert stats.pairs_needed(0.5) == 3, "0.5 with 2 pairs is not below 0.5"
    assert stats.pairs_needed(1 / 32) == 7 and stats.pairs_needed(1.5) == 0


def test_the_sign_test_drops_ties_and_takes_the_larger_side():
    faster = stats.sign_test([1.1, 1.2, 1.0, 0.9, 1.3, 1.05, 1.02, 1.0])
    assert faster == {
        "pairs": 8,
        "untied": 6,
        "above_1": 5,
        "below_1": 1,
        "p": pytest.approx(14 / 64),
        "smallest_p": pytest.approx(1 / 32),
        "needed": 6,
    }
    slower = stats.sign_test([0.9, 0.8, 0.95, 0.99, 0.7, 0.97, 1.01])
    assert (slower["above_1"], slower["below_1"]) == (1, 6) and slower["p"] == pytest.approx(2 * 8 / 128)
    assert stats.sign_test([]) == {
        "pairs": 0,
        "untied": 0,
        "above_1": 0,
        "below_1": 0,
        "p": 1.0,
        "smallest_p": 1.0,
        "needed": 6,
    }


def test_significance_names_the_side_only_below_alpha_and_with_enough_pairs():
    test = {"pairs": 6, "untied": 6, "above_1": 6, "below_1": 0, "p": 1 / 32, "smallest_p": 1 / 32, "needed": 6}
    assert stats.significance(test) == "faster"
    assert stats.significance(dict(test, above_1=0, below_1=6)) == "slower"
    assert stats.significance(dict(test, above_1=3, below_1=3)) == "slower", "a tie of sides is not faster"
    assert stats.significance(dict(test, p=0.05)) == "within the noise", "p equal to alpha is not below it"
    assert stats.significance(dict(test, p=0.2), alpha=0.25) == "faster"
    assert stats.significance(dict(test, smallest_p=0.05)) == "too few repeats for a verdict (n=6 pairs, need 6)"
    assert (
        stats.significance(dict(test, pairs=7, smallest_p=0.0625))
        == "too few repeats for a verdict (n=7 pairs, 6 untied, need 6)"
    )
    assert stats.significance(dict(test, smallest_p=0.2), alpha=0.25) == "faster"


# Student's t, two-sided 95%, from a printed table (four decimals)
PRINTED = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 6: 2.4469, 7: 2.3646, 8: 2.3060, 9: 2.2622}
PRINTED |= {10: 2.2281, 12: 2.1788, 15: 2.1314, 20: 2.0860, 30: 2.0423, 60: 2.0003, 120: 1.9799}


def test_the_t_quantiles_are_the_printed_ones_rounded_and_read_at_the_degrees_of_freedom_below():
    assert stats.T975 == {df: round(v, 2) for df, v in PRINTED.items()}
    assert stats.t975(None) == 1.96 and stats.t975(120.5) == 1.96 and stats.t975(1000) == 1.96
    assert stats.t975(120) == 1.98 and stats.t975(119.9) == 2.00
    assert stats.t975(1) == 12.71 and stats.t975(1.99) == 12.71 and stats.t975(0.4) == 12.71
    assert stats.t975(2) == 4.30 and stats.t975(2.7) == 4.30 and stats.t975(11) == 2.23 and stats.t975(12) == 2.18
