"""The signal scraper: each backend's metrics, slots and health pages read off the request path, about
every ``interval_s``, into the live stats (``signals.py`` reads what the pages say, ``boot.py`` what a
health answer means); a failing health check keeps a booting backend out of rotation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from gateway.backends.base import Fetched
from gateway.measure.boot import read_health
from gateway.measure.signals import LoadSignals, parse_llamacpp_slots, parse_metrics
from gateway.policy.compiled import CompiledBackend


class Fetch(Protocol):
    """A GET through the process's upstream HTTP stack, reaching ``url`` as ``backend`` says (its TLS
    context and proxy setting): what came back."""

    def __call__(
        self,
        url: str,
        headers: dict[str, str] | None,
        timeout_s: float,
        backend: CompiledBackend | None = None,
    ) -> Awaitable[Fetched]: ...


logger = logging.getLogger("gateway.measure.scraper")


class SignalSink(Protocol):
    """Where scraped signals go: the live stats the decision reads."""

    def update_signals(self, backend: str, signals: LoadSignals) -> None: ...

    def set_health(self, backend: str, healthy: bool, booting: bool = False) -> None: ...


def body_of(reply: Fetched) -> str:
    """The text of a 200 answer; ValueError naming what came instead."""
    if reply.status is None:
        raise ValueError(reply.error)
    if reply.status != 200:
        raise ValueError(f"HTTP {reply.status}")
    return reply.text


@dataclass(slots=True)
class _Watch:
    """What the scraper remembers about one backend between rounds."""

    backend: CompiledBackend
    task: asyncio.Task[None] | None = None
    previous: LoadSignals | None = None  # last metrics reading, for the token rate
    last_attempt_at: float | None = None
    last_scrape_at: float | None = None
    last_error: str | None = None
    stale: bool = False
    healthy: bool | None = None  # None until the first health answer
    booting: bool = False
    load_error: str | None = None  # the last load round's errors, and the last health check's
    health_error: str | None = None
    health_checked: bool = False
    first_look_at: float | None = None  # clock of the first health GET, for the policy's expected boot
    ready_once: bool = False  # answered healthy since the first look: a refusal now is a fall, not a boot


class SignalScraper:
    """One asyncio loop per backend that has signal URLs, each about every ``interval_s`` seconds."""

    def __init__(
        self, sink: SignalSink, fetch: Fetch, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._sink = sink
        self._fetch = fetch
        self._clock = clock
        self._round_done = asyncio.Event()  # set after every round, for first_round_done
        self._watches: dict[str, _Watch] = {}
        self._retired: set[asyncio.Task[None]] = set()
        self._running = False

    def set_backends(self, backends: Mapping[str, CompiledBackend]) -> None:
        """Follow a (re)loaded policy; must be called from the event loop's thread."""
        for name in [name for name in self._watches if name not in backends]:
            self._retire(self._watches.pop(name))
        for name, backend in backends.items():
            watch = self._watches.get(name)
            if watch is not None and _same_source(watch.backend, backend):
                watch.backend = backend  # the loop reads it each round: new key or timeouts apply
                continue
            if watch is not None:
                self._retire(watch)
            self._watches[name] = _Watch(backend)
        if self._running:
            self._start_loops()

    async def start(self) -> None:
        self._running = True
        self._start_loops()

    async def stop(self) -> None:
        self._running = False
        tasks = list(self._retired)
        for watch in self._watches.values():
            if watch.task is not None:
                tasks.append(watch.task)
                watch.task = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def first_round_done(self, timeout_s: float = 2.0) -> None:
        """Wait (briefly) until every watched backend has had its first round, so that a readiness
        check right after start-up reports what the backends said rather than "unknown"."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                while any(w.task is not None and not _first_round_done(w) for w in self._watches.values()):
                    self._round_done.clear()
                    await self._round_done.wait()

    def status(self) -> dict[str, dict[str, object]]:
        return {
            name: {
                "watched": _has_signal_urls(watch.backend),
                "last_scrape_at": watch.last_scrape_at,
                "last_attempt_at": watch.last_attempt_at,
                "last_error": watch.last_error,
                "stale": watch.stale,
                "healthy": watch.healthy if watch.backend.signals.health_url else True,
                "booting": watch.booting,
            }
            for name, watch in self._watches.items()
        }

    async def scrape_once(self, backend: CompiledBackend) -> None:
        """One round: metrics, slots and health, read together. Never raises for a backend's fault."""
        watch = self._watches.setdefault(backend.name, _Watch(backend))
        now = self._clock()
        await asyncio.gather(self._load_round(watch, now), self._health_round(watch, now))

    async def _load_round(self, watch: _Watch, now: float) -> None:
        backend = watch.backend
        metrics, slots = await asyncio.gather(
            self._get(backend, backend.signals.metrics_url), self._get(backend, backend.signals.slots_url)
        )
        watch.last_attempt_at = now
        self._round_done.set()
        errors: list[str] = []
        load = self._read_load(backend, watch, now, metrics, slots, errors)
        if load is not None:
            watch.last_scrape_at = now
            self._sink.update_signals(backend.name, load)
        self._note_load_errors(watch, errors)
        watch.load_error = "; ".join(errors) or None
        watch.last_error = "; ".join(e for e in (watch.load_error, watch.health_error) if e) or None

    async def _health_round(self, watch: _Watch, now: float) -> None:
        signals = watch.backend.signals
        # Its own deadline: SGLang's health is a one-token generation, over a second by design.
        reply = await self._get(watch.backend, signals.health_url, signals.health_timeout_s)
        if reply is None:
            return
        errors: list[str] = []
        self._note_health(watch, reply, now, errors)
        watch.health_checked = True
        self._round_done.set()
        watch.health_error = "; ".join(errors) or None
        watch.last_error = "; ".join(e for e in (watch.load_error, watch.health_error) if e) or None

    def _start_loops(self) -> None:
        for watch in self._watches.values():
            if watch.task is None and _has_signal_urls(watch.backend):
                watch.task = asyncio.create_task(self._run(watch), name=f"signals:{watch.backend.name}")

    def _retire(self, watch: _Watch) -> None:
        if watch.task is not None:
            watch.task.cancel()
            self._retired.add(watch.task)
            watch.task.add_done_callback(self._retired.discard)

    async def _run(self, watch: _Watch) -> None:
        loop = asyncio.get_running_loop()
        health: asyncio.Task[None] | None = None
        try:
            while True:
                started = loop.time()
                now = self._clock()
                # The health check runs beside the load round, never in it: SGLang's takes over a second,
                # and load signals older than a few intervals read as stale.
                if health is None or health.done():
                    health = asyncio.create_task(self._guarded(watch, self._health_round(watch, now)))
                await self._guarded(watch, self._load_round(watch, now))
                interval = watch.backend.signals.interval_s
                await asyncio.sleep(max(0.0, interval - (loop.time() - started)))
        finally:
            if health is not None:
                health.cancel()

    async def _guarded(self, watch: _Watch, round_: Awaitable[None]) -> None:
        try:
            await round_
        except Exception:  # a bug (ours or the sink's) must not silently freeze this backend's signals
            logger.exception("signal round for %s failed", watch.backend.name)

    async def _get(
        self, backend: CompiledBackend, url: str | None, timeout_s: float | None = None
    ) -> Fetched | None:
        if url is None:
            return None
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
        # Short: a round must not outlive its interval by much, yet a busy box answers slower.
        return await self._fetch(
            url, headers, timeout_s or min(max(backend.signals.interval_s, 0.5), 2.0), backend
        )

    def _read_load(
        self,
        backend: CompiledBackend,
        watch: _Watch,
        now: float,
        metrics: Fetched | None,
        slots: Fetched | None,
        errors: list[str],
    ) -> LoadSignals | None:
        load: LoadSignals | None = None
        if metrics is not None:
            try:
                load = parse_metrics(backend.dialect, body_of(metrics), now, watch.previous)
            except ValueError as exc:
                errors.append(f"metrics: {exc}")
            else:
                watch.previous = load
        if slots is not None:
            try:
                total, busy = parse_llamacpp_slots(json.loads(body_of(slots)))
            except ValueError as exc:
                errors.append(f"slots: {exc}")
            else:
                load = replace(load or LoadSignals(scraped_at=now), slots_total=total, slots_busy=busy)
        return load

    def _note_load_errors(self, watch: _Watch, errors: list[str]) -> None:
        stale = bool(errors)
        if stale and not watch.stale:
            logger.warning("load signals of %s are stale: %s", watch.backend.name, "; ".join(errors))
        elif watch.stale and not stale:
            logger.info("load signals of %s are fresh again", watch.backend.name)
        watch.stale = stale

    def _note_health(self, watch: _Watch, reply: Fetched, now: float, errors: list[str]) -> None:
        if watch.first_look_at is None:
            watch.first_look_at = now
        backend = watch.backend
        reading = read_health(
            backend.dialect,
            reply,
            ready_once=watch.ready_once,
            waited_s=now - watch.first_look_at,
            expected_boot_s=backend.signals.expected_boot_s,
        )
        watch.ready_once = watch.ready_once or reading.healthy
        healthy, booting = reading.healthy, reading.booting
        if not healthy:
            errors.append(f"health: {reply.error or f'HTTP {reply.status}'}")
        if (healthy, booting) == (watch.healthy, watch.booting):
            return
        name = backend.name
        if healthy:
            logger.info("backend %s is healthy", name)
        elif booting:
            logger.info("backend %s is %s", name, reading.why)
        else:
            logger.warning("backend %s is unhealthy: %s", name, reading.why)
        watch.healthy, watch.booting = healthy, booting
        self._sink.set_health(name, healthy, booting)


def _same_source(old: CompiledBackend, new: CompiledBackend) -> bool:
    """Whether a reload left what is scraped alone, so the previous sample still counts."""
    return old.dialect == new.dialect and old.signals == new.signals


def _first_round_done(watch: _Watch) -> bool:
    return watch.last_attempt_at is not None and (
        watch.health_checked or not watch.backend.signals.health_url
    )


def _has_signal_urls(backend: CompiledBackend) -> bool:
    signals = backend.signals
    return any((signals.metrics_url, signals.slots_url, signals.health_url))
