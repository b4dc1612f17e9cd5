"""Interval algebra on [start, end) lists: union, total, intersection, clipping, complement, difference."""

import math
import sys
from collections.abc import Iterable, Iterator, Sequence


def union(intervals: Iterable[Sequence[float]]) -> list[list[float]]:
    """Sorted, merged [start, end) pairs."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1][1] = e
        else:
            out.append([s, e])
    return out


def total(merged: Iterable[Sequence[float]]) -> float:
    return sum(e - s for s, e in merged)


# sum() of floats: a plain running sum up to Python 3.11, Neumaier's compensated sum from 3.12 (CPython's
# builtin_sum_impl)
_COMPENSATED = sys.version_info >= (3, 12)


class Total:
    """sum() of floats given one at a time (add): value() is the float sum() gives for the same floats (exact
    floats only: not ints, not subclasses) in the same order on the running Python, or the int 0 where none was
    added, as sum() starts. For sums made side by side in one pass over intervals (total of each), where each
    sum() would need its own pass."""

    __slots__ = ("f", "c", "n")

    def __init__(self):
        self.f, self.c, self.n = 0.0, 0.0, False

    def add(self, x: float) -> None:
        if not self.n:  # 0 + x: -0.0 becomes 0.0, as in sum()
            self.f, self.n = 0 + x, True
        elif not _COMPENSATED:
            self.f += x
        else:
            f = self.f
            t = f + x
            self.c += (f - t) + x if abs(f) >= abs(x) else (x - t) + f
            self.f = t

    def value(self) -> float:
        if not self.n:
            return 0
        if _COMPENSATED and self.c and math.isfinite(self.c):
            return self.f + self.c
        return self.f


def intersect(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> list[list[float]]:
    """Intersection of two merged interval lists (two pointers)."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append([s, e])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def clip(merged: Sequence[Sequence[float]], start: float, end: float) -> list[list[float]]:
    return intersect(merged, [[start, end]])


def complement(merged: Sequence[Sequence[float]], start: float, end: float) -> list[list[float]]:
    return gaps(clip(merged, start, end), start, end)


def minus(a: Iterable[Sequence[float]], b: Sequence[Sequence[float]]) -> list[list[float]]:
    """The parts of merged intervals a outside merged intervals b."""
    out = []
    for s, e in a:
        cur = s
        for bs, be in clip(b, s, e):
            if bs > cur:
                out.append([cur, bs])
            cur = max(cur, be)
        if cur < e:
            out.append([cur, e])
    return out


def gaps(clipped: Iterable[Sequence[float]], start: float, end: float) -> list[list[float]]:
    """complement of intervals already clipped to [start, end)."""
    out, cur = [], start
    for s, e in clipped:
        if s > cur:
            out.append([cur, s])
        cur = max(cur, e)
    if cur < end:
        out.append([cur, end])
    return out


def iintersect(a: Iterable[Sequence[float]], b: Iterable[Sequence[float]]) -> Iterator[list[float]]:
    """intersect of two interval sequences given as iterators: the same pairs, one at a time."""
    a, b = iter(a), iter(b)
    x, y = next(a, None), next(b, None)
    while x is not None and y is not None:
        s, e = max(x[0], y[0]), min(x[1], y[1])
        if s < e:
            yield [s, e]
        if x[1] < y[1]:
            x = next(a, None)
        else:
            y = next(b, None)
