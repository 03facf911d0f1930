"""What /metrics shows, in Prometheus' text format: requests, tokens, latency, slots and prefix
cache per loaded model, model loads and unloads.

Each app has its own registry (no process-global metrics), so tests can build several apps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localchat.model_pool import PoolEvent
from localchat.prefix_cache import PrefixCache
from localchat.scheduler import Scheduler
from localchat.session import GenerationStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PER_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
LOAD_RESULTS = {"loaded": "loaded", "load_failed": "failed", "busy": "busy"}
# The loaded models by id, each with its scheduler and prefix cache; read at scrape time.
LoadedModels = Callable[[], Mapping[str, tuple[Scheduler, PrefixCache]]]


class _EngineCollector(Collector):
    """Read at scrape time, one sample per loaded model: slots and queue from its scheduler, hits
    from its prefix cache."""

    def __init__(self, loaded: LoadedModels) -> None:
        self.loaded = loaded

    def collect(self) -> Iterator[Metric]:
        loaded = self.loaded()
        yield GaugeMetricFamily("localchat_models_loaded", "Models loaded", value=len(loaded))
        families = [
            (GaugeMetricFamily, "localchat_slots", "Parallel sequences (slots) in the batch", lambda s, _: s.n_slots),
            (GaugeMetricFamily, "localchat_slots_busy", "Slots producing a reply", lambda s, _: s.busy_slots),
            (GaugeMetricFamily, "localchat_requests_waiting", "Replies queued for a slot (a request's choices, one each)",
             lambda s, _: s.waiting),
            (CounterMetricFamily, "localchat_prefix_cache_hits", "Prompts that found a saved KV prefix", lambda _, c: c.hits),
            (CounterMetricFamily, "localchat_prefix_cache_misses", "Prompts that found no saved KV prefix",
             lambda _, c: c.misses),
            (CounterMetricFamily, "localchat_prefix_cache_skipped",
             "Saved KV prefixes found but computed instead, computing being measured faster than restoring",
             lambda _, c: c.skipped),
            (GaugeMetricFamily, "localchat_prefix_cache_entries", "Saved KV prefixes", lambda _, c: len(c)),
        ]
        for family_class, name, documentation, read in families:
            family = family_class(name, documentation, labels=["model"])
            for model, (scheduler, prefix_cache) in loaded.items():
                family.add_metric([model], read(scheduler, prefix_cache))
            yield family


class ServerMetrics:
    def __init__(self, loaded: LoadedModels, routes: frozenset[str]) -> None:
        self.registry = CollectorRegistry()
        self.routes = routes
        self.requests = Counter(
            "localchat_http_requests", "HTTP requests answered", ["path", "status"], registry=self.registry
        )
        self.replies = Counter("localchat_replies", "Replies ended, by finish reason", ["finish_reason"], registry=self.registry)
        self.sampled_replies = Counter(
            "localchat_sampler_replies", "Replies ended, by the sampler settings they used (the model's defaults unless the "
            "request set some)", ["sampler"], registry=self.registry)
        self.prompt_tokens = Counter("localchat_prompt_tokens", "Prompt tokens received", registry=self.registry)
        self.cached_prompt_tokens = Counter(
            "localchat_prompt_tokens_cached", "Prompt tokens whose KV was reused, not evaluated", registry=self.registry
        )
        self.completion_tokens = Counter("localchat_completion_tokens", "Tokens generated", registry=self.registry)
        self.draft_tokens = Counter("localchat_draft_tokens", "Tokens drafted by prompt lookup (speculative decoding)",
                                    registry=self.registry)
        self.draft_tokens_accepted = Counter("localchat_draft_tokens_accepted",
                                             "Drafted tokens the sampler picked too (kept without a step of their own)",
                                             registry=self.registry)
        self.ttft = Histogram(
            "localchat_time_to_first_token_seconds", "From request to first token, queueing included",
            buckets=TTFT_BUCKETS, registry=self.registry,
        )
        self.per_token = Histogram(
            "localchat_time_per_output_token_seconds", "Decode time per generated token after the first, per reply",
            buckets=PER_TOKEN_BUCKETS, registry=self.registry,
        )
        self.model_loads = Counter("localchat_model_loads", "Model loads, by result (loaded, failed, busy: no room freed in time)",
                                   ["model", "result"], registry=self.registry)
        self.model_load_seconds = Histogram("localchat_model_load_seconds", "Time to load a model (successful loads)",
                                            ["model"], buckets=LOAD_BUCKETS, registry=self.registry)
        self.model_unloads = Counter("localchat_model_unloads", "Models unloaded", ["model"], registry=self.registry)
        self.registry.register(_EngineCollector(loaded))

    def observe_pool(self, event: PoolEvent) -> None:
        if event.kind == "unloaded":
            self.model_unloads.labels(event.name).inc()
            return
        self.model_loads.labels(event.name, LOAD_RESULTS[event.kind]).inc()
        if event.kind == "loaded":
            self.model_load_seconds.labels(event.name).observe(event.seconds)

    def observe_reply(self, stats: GenerationStats) -> None:
        """Called where the scheduler steps (llama.cpp's compute thread) when a reply ends
        (prometheus_client is thread-safe)."""
        self.replies.labels(stats.finish_reason).inc()
        if stats.sampler is not None:
            self.sampled_replies.labels(stats.sampler.describe()).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_prompt_tokens.inc(stats.cached_tokens)
        self.completion_tokens.inc(stats.completion_tokens)
        self.draft_tokens.inc(stats.drafted_tokens)
        self.draft_tokens_accepted.inc(stats.accepted_tokens)
        if stats.completion_tokens > 0:
            self.ttft.observe(stats.ttft_s)
        if stats.completion_tokens > 1:
            self.per_token.observe(stats.decode_s / (stats.completion_tokens - 1))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class RequestCounter:
    """Counts every HTTP response by path and status, including those a guard sent."""

    def __init__(self, app: ASGIApp, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Unknown paths share one label, so a scan cannot grow the metrics without bound.
        path = scope["path"] if scope["path"] in self.metrics.routes else "other"

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.requests.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
