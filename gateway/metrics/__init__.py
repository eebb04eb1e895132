"""Prometheus metrics, declared once, in a registry of the Runtime's own: counters and histograms fed
from each finished request's Observation, gauges read at scrape time from live stats, budgets, the
policy holder and the ledger. Labels are policy names (route, backend) or fixed vocabularies only.

Gateway overhead is a request's total time (from its first byte read to its end) minus the time an
upstream attempt was open. For a non-streamed request that is reading and parsing the body, the
decision, budget admission and building the response. For a stream it is everything before the
first attempt and between attempts (time to headers less the upstream's wait); the relay's work on
each chunk happens while the attempt is open and is not in this figure.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Coroutine
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, multiprocess

from gateway.metrics.live import LiveCollector, MetricSources, Mirror
from gateway.values.observation import Attempt, Observation
from gateway.version import gateway_version

TTFT_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 30.0, 60.0, 120.0)
FIRST_ANSWER_BUCKETS_S = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
DECODE_BUCKETS = (1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 50.0, 75.0, 100.0, 150.0, 200.0, 500.0)
OVERHEAD_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


def upstream_error_type(attempt: Attempt) -> str | None:
    """The fault an attempt shows, from a fixed vocabulary; None when it succeeded or the client left."""
    status = attempt.status
    if status in ("ok", "cancelled"):
        return None
    if status == "upstream_error" and attempt.http_status is not None:
        code = attempt.http_status
        return "http_429" if code == 429 else "http_5xx" if code >= 500 else "http_4xx"
    return status


def overhead_s(observation: Observation) -> float | None:
    if observation.finished_at is None:
        return None
    upstream = sum(a.duration_s or 0.0 for a in observation.attempts)
    return max(0.0, observation.finished_at - observation.started_at - upstream)


class GatewayMetrics:
    def __init__(self, sources: MetricSources) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        declare_build_info(registry)
        route_backend = ["route", "backend"]
        self.requests = Counter(
            "gateway_requests",
            "Finished requests by route, last backend tried and outcome (ok, or the error type).",
            ["route", "backend", "status"],
            registry=registry,
        )
        self.tokens = Counter(
            "gateway_tokens",
            "Tokens by kind: input (uncached prompt), cached_input, output (answer) and reasoning; "
            "the kinds do not overlap, so their sum is every token.",
            ["route", "backend", "kind"],
            registry=registry,
        )
        self.spend = Counter(
            "gateway_spend_usd",
            "USD charged to requests (GPU-hour pools amortized), by route and the backend the ledger names.",
            route_backend,
            registry=registry,
        )
        self.decisions = Counter(
            "gateway_decisions",
            "Routing decisions by route and reason.",
            ["route", "reason"],
            registry=registry,
        )
        self.resumed = Counter(
            "gateway_streams_resumed",
            "Streams a backend broke off that another one took over, by route and mode: 'continued' "
            "from the answer so far, or 'restarted' (cut while thinking).",
            ["route", "mode"],
            registry=registry,
        )
        self.refused = Counter(
            "gateway_refused_requests",
            "Requests the gateway turned away before trying a backend, by reason: the error code it "
            "answered with (invalid_json, model_not_found, invalid_api_key, budget_exhausted, ...).",
            ["reason"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            "gateway_upstream_errors",
            "Failed upstream attempts, by backend and type (http_5xx, http_429, timeout, dropped, ...).",
            ["backend", "type"],
            registry=registry,
        )
        self.ttft = Histogram(
            "gateway_ttft_seconds",
            "Upstream time to first token (reasoning or answer) per attempt.",
            route_backend,
            buckets=TTFT_BUCKETS_S,
            registry=registry,
        )
        self.first_answer = Histogram(
            "gateway_time_to_first_answer_seconds",
            "Upstream time to the first answer (non-reasoning) token per attempt.",
            route_backend,
            buckets=FIRST_ANSWER_BUCKETS_S,
            registry=registry,
        )
        self.decode = Histogram(
            "gateway_decode_tokens_per_second",
            "Decode speed of successful attempts: output tokens after the first, over the time they took.",
            route_backend,
            buckets=DECODE_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "The gateway's own time per request: total time minus time with an upstream attempt open.",
            ["stream"],
            buckets=OVERHEAD_BUCKETS_S,
            registry=registry,
        )
        self.prefix_cache = Counter(
            "gateway_prefix_cache_tokens",
            "Cached prompt tokens on the backend that answered, by kind: 'predicted' by the gateway's "
            "prefix index, 'reported' by the backend, and 'error' (|predicted - reported|), for the "
            "answers that had both; the prediction's error rate is error / reported.",
            ["backend", "kind"],
            registry=registry,
        )
        self.policy_loaded_at = sources.wall_clock()
        # Label values are policy names and fixed vocabularies, so this stays as small as the policy.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        live = LiveCollector(sources, lambda: self.policy_loaded_at)
        registry.register(live)
        self.multiprocess = "PROMETHEUS_MULTIPROC_DIR" in os.environ
        self._mirror = Mirror(live) if self.multiprocess else None
        if self._mirror is not None:
            # Every worker's files merged at each scrape, whichever worker serves it.
            self._exposed = CollectorRegistry()
            multiprocess.MultiProcessCollector(self._exposed)  # type: ignore[no-untyped-call]

    def request_finished(self, observation: Observation) -> None:
        route, backend = observation.route, observation.backend or ""
        status = "ok" if observation.status == "ok" else observation.error_type or "error"
        self._child(self.requests, route, backend, status).inc()
        if observation.status == "refused":
            self._child(self.refused, observation.error_type or "").inc()
        if observation.decision_reason is not None:
            self._child(self.decisions, route, observation.decision_reason).inc()
        if observation.cost_usd:
            self._child(self.spend, route, backend).inc(observation.cost_usd)
        for attempt in observation.attempts:
            self._attempt(route, attempt)
        predicted, final = observation.predicted_cached_tokens, observation.final
        if (
            predicted is not None
            and final is not None
            and final.usage is not None
            and final.usage.cached_reported
        ):
            reported = final.usage.cached_prompt_tokens
            self._child(self.prefix_cache, backend, "predicted").inc(predicted)
            self._child(self.prefix_cache, backend, "reported").inc(reported)
            self._child(self.prefix_cache, backend, "error").inc(abs(predicted - reported))
        overhead = overhead_s(observation)
        if overhead is not None:
            self._child(self.overhead, "true" if observation.stream else "false").observe(overhead)

    def _attempt(self, route: str, attempt: Attempt) -> None:
        backend = attempt.backend
        if attempt.resumed is not None:
            self._child(self.resumed, route, attempt.resumed).inc()
        fault = upstream_error_type(attempt)
        if fault is not None:
            self._child(self.upstream_errors, backend, fault).inc()
        if attempt.ttft_s is not None:
            self._child(self.ttft, route, backend).observe(attempt.ttft_s)
        if attempt.first_answer_s is not None:
            self._child(self.first_answer, route, backend).observe(attempt.first_answer_s)
        usage = attempt.usage
        if usage is not None:
            cached = min(usage.cached_prompt_tokens, usage.prompt_tokens)
            reasoning = min(usage.reasoning_tokens, usage.completion_tokens)
            for kind, count in (
                ("input", usage.prompt_tokens - cached),
                ("cached_input", cached),
                ("output", usage.completion_tokens - reasoning),
                ("reasoning", reasoning),
            ):
                if count:
                    self._child(self.tokens, route, backend, kind).inc(count)
        if attempt.status == "ok":
            speed = attempt.decode_tokens_per_s
            if speed is not None:
                self._child(self.decode, route, backend).observe(speed)

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, remembered: prometheus_client validates and locks on every
        ``labels()`` call, which cost more than the rest of a request's accounting together."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def policy_installed(self, wall: float) -> None:
        self.policy_loaded_at = wall

    def exposition(self) -> bytes:
        if self._mirror is None:
            return generate_latest(self.registry)
        self._mirror.update()
        return generate_latest(self._exposed)

    def background(self) -> list[Coroutine[Any, Any, None]]:
        """Tasks the runtime runs while it serves: in multiprocess mode, mirroring the live gauges, so
        a scrape served by another worker sees this one's too."""
        return [] if self._mirror is None else [self._mirror.run()]

    def close(self) -> None:
        if self.multiprocess:
            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


# --- build info: which version answers, for dashboards and "what is running where" ------------------


def declare_build_info(registry: CollectorRegistry) -> None:
    """``gateway_build_info{version, python} 1``, the Prometheus convention for a build's identity."""
    info = Gauge(
        "gateway_build_info",
        "Always 1; the labels say which gateway version and Python runs this process.",
        ["version", "python"],
        registry=registry,
        multiprocess_mode="max",
    )
    info.labels(gateway_version(), platform.python_version()).set(1)
