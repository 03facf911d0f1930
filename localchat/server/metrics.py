"""What /metrics shows, in Prometheus' text format: requests, tokens, latency, slots, prefix cache.

Each app has its own registry (no process-global metrics), so tests can build several apps.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from localchat.prefix_cache import PrefixCache
from localchat.scheduler import Scheduler
from localchat.session import GenerationStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PER_TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)


class _EngineCollector(Collector):
    """Read at scrape time: slots and queue from the scheduler, hits from the prefix cache."""

    def __init__(self, scheduler: Scheduler, prefix_cache: PrefixCache) -> None:
        self.scheduler = scheduler
        self.prefix_cache = prefix_cache

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("localchat_slots", "Parallel sequences (slots) in the batch", value=self.scheduler.n_slots)
        yield GaugeMetricFamily("localchat_slots_busy", "Slots producing a reply", value=self.scheduler.busy_slots)
        yield GaugeMetricFamily("localchat_requests_waiting", "Requests queued for a slot", value=self.scheduler.waiting)
        yield CounterMetricFamily(
            "localchat_prefix_cache_hits", "Prompts that found a saved KV prefix", value=self.prefix_cache.hits
        )
        yield CounterMetricFamily(
            "localchat_prefix_cache_misses", "Prompts that found no saved KV prefix", value=self.prefix_cache.misses
        )
        yield GaugeMetricFamily("localchat_prefix_cache_entries", "Saved KV prefixes", value=len(self.prefix_cache))


class ServerMetrics:
    def __init__(self, scheduler: Scheduler, prefix_cache: PrefixCache, routes: frozenset[str]) -> None:
        self.registry = CollectorRegistry()
        self.routes = routes
        self.requests = Counter(
            "localchat_http_requests", "HTTP requests answered", ["path", "status"], registry=self.registry
        )
        self.replies = Counter("localchat_replies", "Replies ended, by finish reason", ["finish_reason"], registry=self.registry)
        self.prompt_tokens = Counter("localchat_prompt_tokens", "Prompt tokens received", registry=self.registry)
        self.cached_prompt_tokens = Counter(
            "localchat_prompt_tokens_cached", "Prompt tokens whose KV was reused, not evaluated", registry=self.registry
        )
        self.completion_tokens = Counter("localchat_completion_tokens", "Tokens generated", registry=self.registry)
        self.ttft = Histogram(
            "localchat_time_to_first_token_seconds", "From request to first token, queueing included",
            buckets=TTFT_BUCKETS, registry=self.registry,
        )
        self.per_token = Histogram(
            "localchat_time_per_output_token_seconds", "Decode time per generated token after the first, per reply",
            buckets=PER_TOKEN_BUCKETS, registry=self.registry,
        )
        self.registry.register(_EngineCollector(scheduler, prefix_cache))

    def observe_reply(self, stats: GenerationStats) -> None:
        """Called on the scheduler's thread when a reply ends (prometheus_client is thread-safe)."""
        self.replies.labels(stats.finish_reason).inc()
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.cached_prompt_tokens.inc(stats.cached_tokens)
        self.completion_tokens.inc(stats.completion_tokens)
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
