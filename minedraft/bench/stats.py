"""Summary statistics shared by the benchmarks."""

import statistics

from minedraft.engine.sequence import time_per_output_token


def percentiles(values: list[float]) -> dict:
    """Mean, inclusive p50 / p90 / p99 and max of per-request figures (None when there are none)."""
    if not values:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
    return {"mean": statistics.mean(values), "p50": q[49], "p90": q[89], "p99": q[98], "max": max(values)}


def request_figures(e2e: list[float], ttft: list[float], tokens: list[int], makespan: float) -> dict:
    """Throughput and latency figures from per-request end-to-end time, time to first token and
    output tokens (seconds); TPOT = (E2E - TTFT) / (tokens - 1)."""
    latency = percentiles(e2e)
    tpot = [t for e, f, n in zip(e2e, ttft, tokens) if (t := time_per_output_token(e, f, n)) is not None]
    return {
        "output_tokens_per_s": sum(tokens) / makespan,
        "requests_per_s": len(e2e) / makespan,
        "latency_mean_s": latency["mean"],
        "latency_p50_s": latency["p50"], "latency_p90_s": latency["p90"], "latency_p99_s": latency["p99"],
        "ttft_mean_s": statistics.mean(ttft),
        "tpot_mean_s": statistics.mean(tpot) if tpot else 0.0,
        "e2e_s": list(e2e),
    }


def markdown_table(headers: list[str], rows: list[list]) -> str:
    """A Markdown table: a header line, the separator and one line per row."""
    lines = [headers, ["---"] * len(headers), *rows]
    return "\n".join("| " + " | ".join(str(cell) for cell in line) + " |" for line in lines)
