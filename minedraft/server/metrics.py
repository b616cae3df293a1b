"""Prometheus metrics, named in vLLM's style with a `minedraft:` prefix."""

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from minedraft.engine.sequence import RequestOutput

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)


class EngineCollector:
    """Values read from the engine at scrape time: queue state and speculative-decoding counters."""

    def __init__(self, server):
        self.server = server

    def collect(self):
        engine = self.server.engine
        yield GaugeMetricFamily("minedraft:num_requests_running", "Requests being generated.",
                                value=self.server.num_running)
        yield GaugeMetricFamily("minedraft:num_requests_waiting", "Requests waiting to start.",
                                value=self.server.num_waiting)
        spec = engine.spec_metrics
        for name, value, doc in [
            ("spec_decode_num_drafts", spec.num_drafts, "Verified rows that carried draft tokens."),
            ("spec_decode_num_draft_tokens", spec.num_draft_tokens, "Draft tokens proposed."),
            ("spec_decode_num_accepted_tokens", spec.num_accepted_tokens, "Draft tokens accepted."),
            ("spec_decode_num_steps", spec.num_steps, "Speculative steps."),
            ("spec_decode_num_overlapped_steps", spec.num_overlapped_steps, "PSD steps overlapped with drafting."),
            ("spec_decode_drafter_failures", spec.drafter_failures, "Drafter process failures."),
            ("spec_decode_prompts_prefilled_by_drafter", spec.num_prompts_prefilled_by_drafter,
             "Prompts prefilled by the target's copy in the drafter's process."),
        ]:
            yield CounterMetricFamily(f"minedraft:{name}", doc, value=value)
        per_position = CounterMetricFamily("minedraft:spec_decode_num_accepted_tokens_per_pos",
                                           "Drafts whose token at this position was accepted.", labels=["position"])
        for i, value in enumerate(spec.accepted_per_position):
            per_position.add_metric([str(i)], value)
        yield per_position


class ServerMetrics:
    def __init__(self, server):
        self.registry = CollectorRegistry()
        self.registry.register(EngineCollector(server))
        r = self.registry
        self.prompt_tokens = Counter("minedraft:prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter("minedraft:generation_tokens", "Generated tokens.", registry=r)
        self.ttft = Histogram("minedraft:time_to_first_token_seconds", "Time to first token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("minedraft:time_per_output_token_seconds", "Time per output token after the first.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("minedraft:e2e_request_latency_seconds", "End-to-end request latency.",
                             buckets=LATENCY_BUCKETS, registry=r)

    def observe(self, out: RequestOutput) -> None:
        """Record a finished request (called on the engine thread)."""
        generated = sum(len(o.token_ids) for o in out.outputs)
        self.prompt_tokens.inc(len(out.prompt_token_ids))
        self.generation_tokens.inc(generated)
        latencies = out.latencies()
        if latencies is None:
            return
        ttft, tpot, e2e = latencies
        self.ttft.observe(ttft)
        self.e2e.observe(e2e)
        if tpot is not None:
            self.tpot.observe(tpot)
