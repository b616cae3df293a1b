"""Summary statistics shared by the benchmarks."""

import statistics


def percentiles(values: list[float]) -> dict:
    """Mean and inclusive p50 / p90 / p99 of per-request figures (None when there are none)."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return {"mean": statistics.mean(values), "p50": q[49], "p90": q[89], "p99": q[98]}
