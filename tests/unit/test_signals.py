"""Load signals: the vLLM and llama.cpp parsers on real page shapes, and the scraper against real
HTTP servers on loopback whose answers the test changes while it runs."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gateway.backends import Backends
from gateway.measure.scraper import SignalScraper
from gateway.measure.signals import (
    LoadSignals,
    parse_llamacpp_metrics,
    parse_llamacpp_slots,
    parse_vllm_metrics,
)
from gateway.policy.compiled import CompiledBackend
from gateway.policy.schema import Dialect, Signals, Timeouts
from tests.servers import ThreadedServer, threaded_server

# vLLM v1 with two data-parallel engines, as prometheus_client writes it (TTFT histogram trimmed
# to a few buckets; the real page carries a dozen such histograms).
VLLM_METRICS = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12183.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 1.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\
DEPRECATED: Use vllm:kv_cache_usage_perc instead.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.9
vllm:gpu_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.7
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 90210.0
vllm:prompt_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 80110.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 4000.0
vllm:generation_tokens_total{engine="1",model_name="Qwen/Qwen3-8B"} 2500.0
# HELP vllm:generation_tokens_created Number of generation tokens processed.
# TYPE vllm:generation_tokens_created gauge
vllm:generation_tokens_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7563120125e+09
vllm:generation_tokens_created{engine="1",model_name="Qwen/Qwen3-8B"} 1.7563120126e+09
# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="1.0",model_name="Qwen/Qwen3-8B"} 0.0
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 41.0
vllm:request_generation_tokens_count{engine="0",model_name="Qwen/Qwen3-8B"} 41.0
vllm:request_generation_tokens_sum{engine="0",model_name="Qwen/Qwen3-8B"} 4000.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="Qwen/Qwen3-8B"} 12.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="1.0",model_name="Qwen/Qwen3-8B"} 40.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 41.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 41.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 9.87
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7563120125e+09
"""

# vLLM before kv_cache_usage_perc existed: one engine, the old KV-cache name only.
VLLM_OLD_METRICS = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="meta-llama/Llama-3.1-8B-Instruct"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.82
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 31337.0
"""

# llama-server --metrics as its handler writes it today: counters first, then gauges, no labels.
LLAMACPP_METRICS = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 6886
# HELP llamacpp:prompt_seconds_total Prompt process time
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 29.036
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 3469
# HELP llamacpp:tokens_predicted_seconds_total Predict process time
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 35.442
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 3502
# HELP llamacpp:n_tokens_max Largest observed n_tokens.
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 2048
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode counter
llamacpp:n_busy_slots_per_decode 1.31
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s.
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 237.151
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s.
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 97.8773
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

# Older llama-server builds also reported the KV cache.
LLAMACPP_OLD_METRICS = """\
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 7801
# HELP llamacpp:kv_cache_usage_ratio KV-cache usage. 1 means 100 percent usage.
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.375
# HELP llamacpp:kv_cache_tokens KV-cache tokens.
# TYPE llamacpp:kv_cache_tokens gauge
llamacpp:kv_cache_tokens 1536
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 0
"""

NEW_SLOTS = [
    {"id": 0, "id_task": 135, "n_ctx": 65536, "speculative": False, "is_processing": True},
    {"id": 1, "id_task": -1, "n_ctx": 65536, "speculative": False, "is_processing": False},
    {"id": 2, "id_task": -1, "n_ctx": 65536, "speculative": False, "is_processing": False},
    {"id": 3, "id_task": -1, "n_ctx": 65536, "speculative": False, "is_processing": False},
]
OLD_SLOTS = [
    {"id": 0, "id_task": 12, "n_ctx": 4096, "state": 1, "prompt": "Hello", "next_token": {"n_decoded": 7}},
    {"id": 1, "id_task": -1, "n_ctx": 4096, "state": 0, "prompt": "", "next_token": {"n_decoded": 0}},
]


# --- parsers ------------------------------------------------------------------------------------


def test_vllm_counts_are_summed_over_engines_and_kv_cache_averaged() -> None:
    signals = parse_vllm_metrics(VLLM_METRICS, scraped_at=100.0, previous=None)
    assert signals == LoadSignals(
        scraped_at=100.0,
        running=5.0,
        waiting=1.0,
        kv_cache_usage=0.375,  # averaged; the current name wins over the deprecated one
        generation_tokens_total=6500.0,
        generation_tokens_per_s=None,  # a rate needs two readings
    )


def test_vllm_older_kv_cache_name_is_accepted() -> None:
    signals = parse_vllm_metrics(VLLM_OLD_METRICS, scraped_at=1.0, previous=None)
    assert (signals.running, signals.waiting, signals.kv_cache_usage) == (7.0, 4.0, 0.82)
    assert signals.generation_tokens_total == 31337.0


def test_token_rate_between_scrapes() -> None:
    first = parse_vllm_metrics(VLLM_METRICS, scraped_at=100.0, previous=None)
    later = VLLM_METRICS.replace("} 4000.0", "} 4600.0")  # engine 0 made 600 more tokens
    second = parse_vllm_metrics(later, scraped_at=104.0, previous=first)
    assert second.generation_tokens_total == 7100.0
    assert second.generation_tokens_per_s == pytest.approx(150.0)


def test_token_rate_after_a_counter_reset_counts_from_zero() -> None:
    previous = LoadSignals(scraped_at=10.0, generation_tokens_total=50_000.0)
    restarted = parse_llamacpp_metrics(LLAMACPP_METRICS, scraped_at=20.0, previous=previous)
    assert restarted.generation_tokens_total == 3469.0
    assert restarted.generation_tokens_per_s == pytest.approx(346.9)


def test_token_rate_needs_time_to_pass() -> None:
    previous = LoadSignals(scraped_at=20.0, generation_tokens_total=3000.0)
    assert parse_llamacpp_metrics(LLAMACPP_METRICS, 20.0, previous).generation_tokens_per_s is None


def test_llamacpp_metrics() -> None:
    signals = parse_llamacpp_metrics(LLAMACPP_METRICS, scraped_at=5.0, previous=None)
    assert signals == LoadSignals(
        scraped_at=5.0, running=1.0, waiting=2.0, kv_cache_usage=None, generation_tokens_total=3469.0
    )


def test_llamacpp_older_build_reports_kv_cache() -> None:
    signals = parse_llamacpp_metrics(LLAMACPP_OLD_METRICS, scraped_at=5.0, previous=None)
    assert (signals.running, signals.waiting, signals.kv_cache_usage) == (4.0, 0.0, 0.375)


def test_non_finite_samples_are_ignored() -> None:
    text = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing NaN\n"
    assert parse_llamacpp_metrics(text, 1.0, None).running is None


def test_malformed_metrics_raise_value_error() -> None:
    with pytest.raises(ValueError):
        parse_vllm_metrics('vllm:num_requests_running{model_name="m} 1\n', 1.0, None)


@pytest.mark.parametrize(("payload", "expected"), [(NEW_SLOTS, (4, 1)), (OLD_SLOTS, (2, 1)), ([], (0, 0))])
def test_slots_in_both_shapes(payload: object, expected: tuple[int, int]) -> None:
    assert parse_llamacpp_slots(payload) == expected


@pytest.mark.parametrize("payload", [{"slots": []}, [1, 2], [{"id": 0}]])
def test_slots_of_unknown_shape_raise_value_error(payload: object) -> None:
    with pytest.raises(ValueError):
        parse_llamacpp_slots(payload)


# --- the scraper against real servers -----------------------------------------------------------


class Upstream:
    """A vLLM or llama.cpp stand-in whose answers the test changes at run time.

    Paths are ``/{name}/metrics``, ``/{name}/slots`` and ``/{name}/health``, so one server can play
    several backends; each ``/metrics`` answer has 100 more generated tokens than the last.
    """

    def __init__(self, metrics: str = LLAMACPP_METRICS) -> None:
        self.metrics = metrics
        self.metrics_status = 200
        self.health_status = 200
        self.slots: object = NEW_SLOTS
        self.tokens = 0
        self.hits: Counter[tuple[str, str]] = Counter()
        self.authorization: str | None = None

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/{name}/metrics", self._metrics),
                Route("/{name}/slots", self._slots),
                Route("/{name}/health", self._health),
            ]
        )

    def _hit(self, request: Request, kind: str) -> None:
        self.hits[request.path_params["name"], kind] += 1
        self.authorization = request.headers.get("authorization")

    async def _metrics(self, request: Request) -> Response:
        self._hit(request, "metrics")
        self.tokens += 100
        text = self.metrics.replace("3469", str(self.tokens)).replace("} 4000.0", f"}} {self.tokens}.0")
        return PlainTextResponse(text, status_code=self.metrics_status)

    async def _slots(self, request: Request) -> Response:
        self._hit(request, "slots")
        return JSONResponse(self.slots)

    async def _health(self, request: Request) -> Response:
        self._hit(request, "health")
        if self.health_status == 503:
            error = {"code": 503, "message": "Loading model", "type": "unavailable_error"}
            return JSONResponse({"error": error}, status_code=503)
        return JSONResponse({"status": "ok"}, status_code=self.health_status)


class RecordingSink:
    def __init__(self) -> None:
        self.signals: defaultdict[str, list[LoadSignals]] = defaultdict(list)
        self.health: defaultdict[str, list[tuple[bool, bool]]] = defaultdict(list)

    def update_signals(self, backend: str, signals: LoadSignals) -> None:
        self.signals[backend].append(signals)

    def set_health(self, backend: str, healthy: bool, booting: bool = False) -> None:
        self.health[backend].append((healthy, booting))


def make_backend(
    name: str,
    base: str,
    dialect: Dialect = "llamacpp",
    *,
    metrics: bool = True,
    slots: bool = False,
    health: bool = True,
    interval_s: float = 0.05,
    api_key: str | None = None,
) -> CompiledBackend:
    signals = Signals(
        metrics_url=f"{base}/{name}/metrics" if metrics else None,
        slots_url=f"{base}/{name}/slots" if slots else None,
        health_url=f"{base}/{name}/health" if health else None,
        interval_s=interval_s,
    )
    return CompiledBackend(
        name=name,
        dialect=dialect,
        base_url=f"{base}/v1",
        model="m",
        token_prices=None,
        pool_price=None,
        thinking="none",
        max_concurrency=4,
        context_window=None,
        signals=signals,
        timeouts=Timeouts(),
        api_key=api_key,
    )


async def eventually(condition: Callable[[], bool], what: str, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.02)


@pytest.fixture
def upstream() -> Upstream:
    return Upstream()


@pytest.fixture
def server(upstream: Upstream) -> Iterator[ThreadedServer]:
    with threaded_server(upstream.app()) as running:
        yield running


@pytest.fixture
async def backends() -> AsyncIterator[Backends]:
    """The process's upstream HTTP stack, as the runtime hands it to the scraper."""
    clients = Backends()
    yield clients
    await clients.close()


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


async def test_health_goes_booting_then_healthy_then_unhealthy_when_the_server_stops(
    upstream: Upstream,
    server: ThreadedServer,
    sink: RecordingSink,
    backends: Backends,
) -> None:
    upstream.health_status = 503
    scraper = SignalScraper(sink, backends.fetch)
    scraper.set_backends({"llama": make_backend("llama", server.url, slots=True)})
    await scraper.start()
    try:
        await eventually(lambda: sink.health["llama"] == [(False, True)], "booting reported")
        assert scraper.status()["llama"]["booting"] is True

        upstream.health_status = 200
        await eventually(lambda: sink.health["llama"][-1] == (True, False), "healthy reported")
        await eventually(lambda: len(sink.signals["llama"]) >= 2, "signals arrive")
        last = sink.signals["llama"][-1]
        assert (last.running, last.waiting, last.slots_total, last.slots_busy) == (1.0, 2.0, 4, 1)
        assert last.generation_tokens_per_s is not None and last.generation_tokens_per_s > 0

        await asyncio.to_thread(server.stop)
        await eventually(lambda: sink.health["llama"][-1] == (False, False), "unhealthy reported")
        status = scraper.status()["llama"]
        assert status["healthy"] is False and status["stale"] is True
        assert "metrics:" in str(status["last_error"]) and "health:" in str(status["last_error"])
        # Only changes reach the sink, however many rounds saw the same state.
        assert sink.health["llama"] == [(False, True), (True, False), (False, False)]
    finally:
        await scraper.stop()


async def test_reload_starts_and_stops_loops_and_keeps_samples_of_unchanged_backends(
    upstream: Upstream,
    server: ThreadedServer,
    sink: RecordingSink,
    backends: Backends,
) -> None:
    upstream.metrics = VLLM_METRICS
    a = make_backend("a", server.url, "vllm")
    scraper = SignalScraper(sink, backends.fetch)
    scraper.set_backends({"a": a})
    await scraper.start()
    try:
        await eventually(lambda: len(sink.signals["a"]) >= 3, "a scraped")

        # A reload that changes nothing about a's signals (only its concurrency) and adds b.
        mark = len(sink.signals["a"])
        scraper.set_backends({"a": replace(a, max_concurrency=8), "b": make_backend("b", server.url, "vllm")})
        await eventually(lambda: len(sink.signals["b"]) >= 2, "b scraped after the reload")
        await eventually(lambda: len(sink.signals["a"]) >= mark + 2, "a still scraped")
        assert all(s.generation_tokens_per_s is not None for s in sink.signals["a"][mark:])
        assert sink.signals["b"][0].generation_tokens_per_s is None

        # A reload that changes a's signals starts it afresh, and one that drops b stops its loop.
        mark = len(sink.signals["a"])
        scraper.set_backends({"a": make_backend("a", server.url, "vllm", interval_s=0.06)})
        assert set(scraper.status()) == {"a"}
        dropped_at = upstream.hits["b", "metrics"]
        await eventually(lambda: len(sink.signals["a"]) >= mark + 5, "a scraped after the second reload")
        assert sink.signals["a"][mark].generation_tokens_per_s is None
        assert upstream.hits["b", "metrics"] <= dropped_at + 1  # at most the round in flight
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "signals:b"]
    finally:
        await scraper.stop()
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("signals:")]


async def test_backend_without_signal_urls_gets_no_loop_and_counts_as_healthy(
    sink: RecordingSink, backends: Backends
) -> None:
    paid = make_backend("paid", "http://127.0.0.1:9", "openai", metrics=False, health=False)
    scraper = SignalScraper(sink, backends.fetch)
    scraper.set_backends({"paid": paid})
    await scraper.start()
    try:
        await asyncio.sleep(0)
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "signals:paid"]
        status = scraper.status()["paid"]
        assert status["watched"] is False and status["healthy"] is True and status["stale"] is False
        assert not sink.signals and not sink.health
    finally:
        await scraper.stop()


async def test_one_round_computes_the_rate_on_the_injected_clock_and_sends_the_key(
    upstream: Upstream,
    server: ThreadedServer,
    sink: RecordingSink,
    backends: Backends,
) -> None:
    readings = iter([10.0, 12.0])
    scraper = SignalScraper(sink, backends.fetch, clock=lambda: next(readings))
    backend = make_backend("llama", server.url, slots=True, api_key="sk-local")
    try:
        await scraper.scrape_once(backend)
        await scraper.scrape_once(backend)
    finally:
        await scraper.stop()
    first, second = sink.signals["llama"]
    assert (first.scraped_at, second.scraped_at) == (10.0, 12.0)
    assert second.generation_tokens_per_s == pytest.approx(50.0)  # 100 tokens in 2 clock seconds
    assert upstream.authorization == "Bearer sk-local"
    assert sink.health["llama"] == [(True, False)]


async def test_failed_scrapes_mark_signals_stale_log_once_and_never_raise(
    upstream: Upstream,
    server: ThreadedServer,
    sink: RecordingSink,
    caplog: pytest.LogCaptureFixture,
    backends: Backends,
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.measure.scraper")
    scraper = SignalScraper(sink, backends.fetch)
    backend = make_backend("llama", server.url, slots=True)
    try:
        upstream.metrics_status = 500
        upstream.slots = {"not": "a list"}
        for _ in range(3):
            await scraper.scrape_once(backend)
        status = scraper.status()["llama"]
        assert status["stale"] is True and status["last_scrape_at"] is None
        assert status["last_error"] == "metrics: HTTP 500; slots: /slots did not answer a JSON list"
        assert not sink.signals["llama"]
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1

        upstream.metrics, upstream.metrics_status = "<html>not metrics</html>", 200
        await scraper.scrape_once(backend)
        assert str(scraper.status()["llama"]["last_error"]).startswith("metrics: ")

        upstream.metrics, upstream.slots = LLAMACPP_METRICS, OLD_SLOTS
        await scraper.scrape_once(backend)
        status = scraper.status()["llama"]
        assert status["stale"] is False and status["last_error"] is None
        assert sink.signals["llama"][-1].slots_total == 2
        assert "fresh again" in caplog.records[-1].getMessage()
    finally:
        await scraper.stop()


async def test_unreachable_backend_is_unhealthy_and_logged_once(
    sink: RecordingSink,
    caplog: pytest.LogCaptureFixture,
    backends: Backends,
) -> None:
    with threaded_server(Upstream().app()) as gone:
        base = gone.url
    scraper = SignalScraper(sink, backends.fetch)
    # llama-server listens before it loads: a refused connection is a server that is not there.
    # (vLLM's would read as booting: it refuses while it loads; tests/unit/test_boot.py.)
    backend = make_backend("down", base, "llamacpp")
    try:
        for _ in range(3):
            await scraper.scrape_once(backend)
    finally:
        await scraper.stop()
    assert sink.health["down"] == [(False, False)]
    assert "ConnectError" in str(scraper.status()["down"]["last_error"])
    unhealthy = [r for r in caplog.records if "unhealthy" in r.getMessage()]
    assert len(unhealthy) == 1 and unhealthy[0].levelno == logging.WARNING
