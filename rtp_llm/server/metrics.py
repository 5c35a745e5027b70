"""Prometheus metrics. Engine state (queue sizes, KV usage, prefix hit rate, token counters) is
read at scrape time by a collector; latencies are histograms observed as requests finish."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5)


class _EngineCollector:
    def __init__(self, engine, model_name: str):
        self.engine, self.model = engine, model_name

    def collect(self):
        s = self.engine.stats()
        labels = ["model_name"]

        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric([self.model], value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric([self.model], value)
            return c

        yield gauge("rtp_llm_num_requests_running", "Sequences running in the engine.", s["running"])
        yield gauge("rtp_llm_num_requests_waiting", "Sequences waiting to be admitted.", s["waiting"])
        yield gauge("rtp_llm_kv_cache_usage_ratio", "Fraction of KV blocks held by running sequences.", s["kv_usage"])
        yield gauge("rtp_llm_kv_cache_free_blocks", "KV blocks neither held nor cached.", s["kv_free_blocks"])
        yield gauge("rtp_llm_prefix_cache_hit_rate", "Prompt tokens served from the prefix cache / looked up.",
                    s["prefix_hit_rate"])
        yield counter("rtp_llm_prompt_tokens", "Prompt tokens computed.", s["prompt_tokens"])
        yield counter("rtp_llm_generation_tokens", "Tokens generated.", s["generation_tokens"])
        yield counter("rtp_llm_prefix_cache_hit_tokens", "Prompt tokens reused from the prefix cache.",
                      s["prefix_hit_tokens"])
        yield counter("rtp_llm_preemptions", "Sequences preempted for lack of KV blocks.", s["preemptions"])
        # The same values under vLLM's names, for dashboards built for vLLM (README: "Metrics").
        yield gauge("vllm:num_requests_running", "Sequences running in the engine.", s["running"])
        yield gauge("vllm:num_requests_waiting", "Sequences waiting to be admitted.", s["waiting"])
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", s["kv_usage"])
        yield counter("vllm:prompt_tokens", "Prompt tokens computed.", s["prompt_tokens"])
        yield counter("vllm:generation_tokens", "Tokens generated.", s["generation_tokens"])
        if "spec_decode_num_drafts" in s:  # speculative decoding on (vLLM's names)
            yield counter("vllm:spec_decode_num_drafts", "Sequence steps that verified drafts.",
                          s["spec_decode_num_drafts"])
            yield counter("vllm:spec_decode_num_draft_tokens", "Draft tokens verified.",
                          s["spec_decode_num_draft_tokens"])
            yield counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                          s["spec_decode_num_accepted_tokens"])
            per_pos = CounterMetricFamily("vllm:spec_decode_num_accepted_tokens_per_pos",
                                          "Draft tokens accepted, by position in the draft.",
                                          labels=labels + ["position"])
            for pos, n in enumerate(s["spec_decode_num_accepted_tokens_per_pos"]):
                per_pos.add_metric([self.model, str(pos)], n)
            yield per_pos


class Metrics:
    def __init__(self, engine, model_name: str):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineCollector(engine, model_name))
        self.model = model_name
        kw = dict(labelnames=["model_name"], registry=self.registry)
        self.ttft = Histogram("rtp_llm_time_to_first_token_seconds", "Time to first token.",
                              buckets=_LATENCY_BUCKETS, **kw)
        self.tpot = Histogram("rtp_llm_time_per_output_token_seconds", "Time per output token after the first.",
                              buckets=_TPOT_BUCKETS, **kw)
        self.e2e = Histogram("rtp_llm_e2e_request_latency_seconds", "Request latency, arrival to finish.",
                             buckets=_LATENCY_BUCKETS, **kw)
        self.finished = Counter("rtp_llm_request_success", "Finished requests by finish reason.",
                                labelnames=["model_name", "finished_reason"], registry=self.registry)
        # vLLM's names. Inter-token latency: each request's mean interval, observed once per interval (the sum
        # and count are exact; the buckets hold means, not single intervals).
        self.vllm_ttft = Histogram("vllm:time_to_first_token_seconds", "Time to first token.",
                                   buckets=_LATENCY_BUCKETS, **kw)
        self.vllm_itl = Histogram("vllm:inter_token_latency_seconds", "Time between output tokens.",
                                  buckets=_TPOT_BUCKETS, **kw)
        self.vllm_e2e = Histogram("vllm:e2e_request_latency_seconds", "Request latency, arrival to finish.",
                                  buckets=_LATENCY_BUCKETS, **kw)
        self.vllm_finished = Counter("vllm:request_success", "Finished requests by finish reason.",
                                     labelnames=["model_name", "finished_reason"], registry=self.registry)

    def observe(self, out) -> None:
        """Records a finished RequestOutput."""
        m = out.metrics
        arrival, first, finish = m.get("arrival"), m.get("first_token"), m.get("finish")
        if arrival is not None and first is not None:
            self.ttft.labels(self.model).observe(first - arrival)
            self.vllm_ttft.labels(self.model).observe(first - arrival)
        if arrival is not None and finish is not None:
            self.e2e.labels(self.model).observe(finish - arrival)
            self.vllm_e2e.labels(self.model).observe(finish - arrival)
        n_out = max((o.num_tokens for o in out.outputs), default=0)
        if first is not None and finish is not None and n_out > 1:
            mean = (finish - first) / (n_out - 1)
            self.tpot.labels(self.model).observe(mean)
            itl = self.vllm_itl.labels(self.model)
            for _ in range(n_out - 1):
                itl.observe(mean)
        for o in out.outputs:
            self.finished.labels(self.model, o.finish_reason or "unknown").inc()
            self.vllm_finished.labels(self.model, o.finish_reason or "unknown").inc()
