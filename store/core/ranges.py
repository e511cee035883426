"""Sets of command ids as sorted, disjoint, inclusive ``[lo, hi]`` ranges (AMQP 0-10 sequence-sets).

Deterministic and compact: the usual idempotence barrier of a session is one or two ranges.
Serial-number wrap-around (RFC 1982) is not handled: a session is limited to 2**32 commands.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Iterator


def contains(ranges: list[list[int]], value: int) -> bool:
    i = bisect_right(ranges, [value, float("inf")]) - 1
    return i >= 0 and ranges[i][0] <= value <= ranges[i][1]


def add(ranges: list[list[int]], lo: int, hi: int) -> None:
    """Insert ``[lo, hi]``, merging with overlapping and adjacent ranges (in place)."""
    if hi < lo:
        lo, hi = hi, lo
    out: list[list[int]] = []
    placed = False
    for r in ranges:
        if r[1] + 1 < lo:
            out.append(r)
        elif hi + 1 < r[0]:
            if not placed:
                out.append([lo, hi])
                placed = True
            out.append(r)
        else:
            lo, hi = min(lo, r[0]), max(hi, r[1])
    if not placed:
        out.append([lo, hi])
    ranges[:] = out


def remove(ranges: list[list[int]], lo: int, hi: int) -> None:
    """Remove ``[lo, hi]`` (in place)."""
    if hi < lo:
        lo, hi = hi, lo
    out: list[list[int]] = []
    for a, b in ranges:
        if b < lo or a > hi:
            out.append([a, b])
            continue
        if a < lo:
            out.append([a, lo - 1])
        if b > hi:
            out.append([hi + 1, b])
    ranges[:] = out


def ids(ranges: Iterable[Iterable[int]], limit: int = 1 << 20) -> Iterator[int]:
    """The ids in ``ranges`` (at most ``limit`` of them: a bound against hostile input)."""
    count = 0
    for lo, hi in ranges:
        if hi < lo:
            lo, hi = hi, lo
        for value in range(lo, hi + 1):
            count += 1
            if count > limit:
                return
            yield value


def from_ids(values: Iterable[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for v in sorted(set(values)):
        if out and out[-1][1] + 1 == v:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out
