"""Interval algebra on [start, end) lists: union, total, intersection, clipping, complement, difference."""

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
