"""What every benchmark shares: time a call repeatedly, summarize the repeats (median and
10th/90th percentiles), and record each figure with where it ran and what it is compared to.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

MIN_REPEATS = 3
MIN_RUN_S = 0.002
"""A timed run of a fast call loops until it lasts about this long (timer resolution)."""

HOST = "host"
FAKE = "host, fake cgroupfs on tmpfs"


def kernel_place() -> str:
    """Where figures measured on a real cgroup v2 hierarchy come from, here."""
    if os.environ.get("DQOES_GUEST") == "1":
        return "guest (qemu TCG), cgroup v2"
    return "host, cgroup v2"


@dataclass(frozen=True)
class Stats:
    """Seconds per call over the repeats."""

    median: float
    p10: float
    p90: float
    repeats: int


def summarize(samples: Sequence[float]) -> Stats:
    p10, median, p90 = np.percentile(np.asarray(samples, dtype=np.float64), [10, 50, 90])
    return Stats(float(median), float(p10), float(p90), len(samples))


def measure(fn: Callable[[], object], *, repeats: int, budget_s: float,
            setup: Callable[[], object] | None = None) -> Stats:
    """Seconds per call of `fn`, after one untimed warm-up call.

    With `setup` (run untimed before each call) every repeat times one call; without, a
    repeat loops over as many calls as fill MIN_RUN_S. Stops early once `budget_s` is spent
    and MIN_REPEATS repeats are done.
    """
    if setup is not None:
        setup()
    start = time.perf_counter()
    fn()
    first = time.perf_counter() - start
    number = 1 if setup is not None else max(1, int(MIN_RUN_S / max(first, 1e-9)))
    samples: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < repeats:
        if setup is not None:
            setup()
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
        if len(samples) >= MIN_REPEATS and time.perf_counter() > deadline:
            break
    return summarize(samples)


@dataclass
class Row:
    """One measured figure. `role` says how to read it: "ours" (dqoes-cg's path),
    "baseline" (another way to do the same job), "floor" (a lower bound for ours) or
    "part" (the share of one step in figures of "ours" measured at the same time).
    `versus` names the row of the same part, place and n its ratio is taken against
    (median / that median): a baseline against ours, ours against a floor."""

    part: str
    case: str
    role: str
    where: str
    n: int | None
    per: str
    median_s: float
    p10_s: float
    p90_s: float
    repeats: int
    versus: str | None = None
    note: str = ""

    @classmethod
    def of(cls, part: str, case: str, stats: Stats, *, where: str, n: int | None = None,
           role: str = "ours", per: str = "call", versus: str | None = None,
           note: str = "") -> Row:
        return cls(part, case, role, where, n, per, stats.median, stats.p10, stats.p90,
                   stats.repeats, versus, note)


@dataclass
class NotMeasured:
    """A figure the bench could not measure where it ran, and the published figure that
    stands in for it in comparisons (clearly labelled as such)."""

    part: str
    case: str
    reason: str
    reference: str
    reference_s: float | None = None  # the reference, in seconds per container


def fmt_time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def ratio(row: Row, rows: Iterable[Row]) -> float | None:
    """row's median over its `versus` row's median (same part, place and n), if any."""
    for other in rows:
        if (row.versus == other.case and other.part == row.part and other.where == row.where
                and other.n == row.n):
            return row.median_s / other.median_s
    return None


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table of rows, for the terminal."""
    lines = [f"{'part':8} {'where':30} {'n':>6} {'case':58} {'median':>10} {'p10-p90':>21} "
             f"{'ratio':>9}"]
    for r in rows:
        x = ratio(r, rows)
        spread = f"{fmt_time(r.p10_s)}-{fmt_time(r.p90_s)}"
        lines.append(f"{r.part:8} {r.where[:30]:30} {r.n if r.n is not None else '':>6} "
                     f"{r.case[:58]:58} {fmt_time(r.median_s):>10} {spread:>21} "
                     f"{'' if x is None else f'{x:.3g}x':>9}")
    return "\n".join(lines)
