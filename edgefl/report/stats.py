"""Spread over seeds: mean and standard deviation, paired differences with a 95 % confidence
interval, and a band of curves on a common grid (or, where they share none, where they end).

A comparison runs every method on the same seeds (the same fleet draw, split and client sampling
for both methods of a pair), so a method is judged against the reference by the per-seed
differences d_s = x_s - r_s: their mean, with the Student t interval mean +- t(0.975, n-1) s / sqrt(n)
(s the sample standard deviation of the d_s), or a percentile bootstrap over the d_s when asked
(Efron and Tibshirani, "An Introduction to the Bootstrap", 1993, ch. 13; scipy.stats.bootstrap).
Times, energy and memory are compared as ratios: the same over log(x_s / r_s), exponentiated, so
the estimate is the geometric mean ratio and the interval a ratio too.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy import stats

LEVEL = 0.95
RESAMPLES = 10_000  # bootstrap resamples, drawn from a fixed seed: the same interval every time
Kind = Literal["difference", "ratio"]


@dataclass(frozen=True)
class Interval:
    """An estimate with its 95 % interval over `n` pairs; low and high are None below two pairs."""

    estimate: float
    low: float | None
    high: float | None
    n: int


def mean_std(values: Sequence[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1); the deviation is None for a single value."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None


def t_interval(values: Sequence[float]) -> Interval:
    """The mean of `values` with its Student t interval at LEVEL."""
    n = len(values)
    mean, sd = mean_std(values)
    if sd is None:
        return Interval(mean, None, None, n)
    half = stats.t.ppf((1 + LEVEL) / 2, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def bootstrap_interval(values: Sequence[float], seed: int = 0) -> Interval:
    """The mean of `values` with a percentile bootstrap interval at LEVEL (RESAMPLES resamples drawn
    from `seed`)."""
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(mean, None, None, n)
    if min(values) == max(values):  # every resample is the same: no spread to resample
        return Interval(mean, mean, mean, n)
    found = stats.bootstrap((np.asarray(values, dtype=float),), np.mean, n_resamples=RESAMPLES,
                            confidence_level=LEVEL, method="percentile", rng=np.random.default_rng(seed))
    ci = found.confidence_interval
    return Interval(mean, float(ci.low), float(ci.high), n)


def paired(reference: Sequence[float], other: Sequence[float], kind: Kind,
           interval: str = "t") -> Interval:
    """`other` against `reference`, pair by pair (the same seed): the mean difference, or for
    `ratio` the geometric mean of other / reference, with its interval (`t` or `bootstrap`)."""
    if len(reference) != len(other) or not reference:
        raise ValueError("paired() needs as many values of each, at least one")
    if kind == "difference":
        diffs = [o - r for r, o in zip(reference, other, strict=True)]
    else:
        diffs = [math.log(o / r) for r, o in zip(reference, other, strict=True)]
    found = bootstrap_interval(diffs) if interval == "bootstrap" else t_interval(diffs)
    if kind == "difference":
        return found
    low, high = (None if v is None else math.exp(v) for v in (found.low, found.high))
    return Interval(math.exp(found.estimate), low, high, found.n)


@dataclass(frozen=True)
class Band:
    """Curves on a common grid: their mean, least and greatest value at each grid point."""

    grid: list[float]
    mean: list[float]
    low: list[float]
    high: list[float]


def band(curves: Sequence[Sequence[tuple[float, float]]], points: int = 100) -> Band | None:
    """Curves given as (x, y) points with x increasing, interpolated linearly on `points` evenly
    spaced x from the latest first x to the earliest last x (the span every curve covers); None
    when the curves share no span."""
    if not curves or any(not c for c in curves):
        return None
    start, end = max(c[0][0] for c in curves), min(c[-1][0] for c in curves)
    if end < start:
        return None
    grid = np.linspace(start, end, points) if end > start else np.array([start])
    ys = np.array([np.interp(grid, [x for x, _ in c], [y for _, y in c]) for c in curves])
    return Band(grid.tolist(), ys.mean(axis=0).tolist(), ys.min(axis=0).tolist(), ys.max(axis=0).tolist())


@dataclass(frozen=True)
class EndPoint:
    """Where curves end: the mean of their last points, with the least and greatest x and y."""

    x: float
    x_low: float
    x_high: float
    y: float
    y_low: float
    y_high: float


def spread(curves: Sequence[Sequence[tuple[float, float]]], points: int = 100) -> Band | EndPoint:
    """The curves' `band` where they share a span of x; else (no common span, or only a point of it)
    their `EndPoint`. Every curve holds a point at least."""
    found = band(curves, points)
    if found is not None and len(found.grid) > 1:
        return found
    xs, ys = [c[-1][0] for c in curves], [c[-1][1] for c in curves]
    return EndPoint(statistics.fmean(xs), min(xs), max(xs), statistics.fmean(ys), min(ys), max(ys))
