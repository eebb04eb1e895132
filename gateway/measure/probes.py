"""Synthetic probes: one short prompt with ``max_tokens: 1`` that keeps a backend's TTFT and health
measured while routing avoids it, so the gateway learns without spending users' requests and notices
a recovery. Probed: every healthy backend once at start-up (and when a reload adds one or it comes
back up), any candidate of a route with an SLO that had no user's sample and no probe for
``tuning.probes.interval_s``, one that such a route excludes (its measurements miss the SLO) at that
interval even while other routes' traffic reaches it, at once again after a probe that answered within
the SLO (``recovery.py``: a few of those in a row end the slow spell), and a backend whose circuit is
open at its scrape interval (a success closes the circuit); a pool only while it has headroom, a paid
API only within the probe budget. Probes are counted apart
(stats, metrics, and the ledger's ``probes`` table: billed to no route and no key).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter, deque
from collections.abc import Mapping
from typing import TYPE_CHECKING

import orjson

from gateway.backends import UpstreamCall
from gateway.errors import AttemptFailure
from gateway.ledger import row_of
from gateway.measure.recovery import RecoveryBar, recovery_bar
from gateway.measure.stats import BackendView
from gateway.money.costs import attempt_cost
from gateway.policy.compiled import CompiledBackend, CompiledPolicy
from gateway.request.meter import StreamMeter
from gateway.request.observation import Attempt, Observation

if TYPE_CHECKING:
    from gateway.runtime import Runtime

log = logging.getLogger("gateway.probes")

TICK_S = 0.05  # real seconds between looks at what is due; probes themselves run at the policy's pace
PROBE_PROMPT = "Reply with one word."
PROBE_PROMPT_TOKENS = 8
# Tokens a probe asks for when a route excludes the backend for its decode speed: enough to time the
# tokens after the first, still a fraction of a cent on a paid API.
DECODE_PROBE_TOKENS = 16
SECONDS_PER_HOUR = 3600.0


class Prober:
    """Decides which backends are due a probe and sends them, off the request path."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._known: set[str] = set()
        self._pending: set[str] = set()  # probe once, as soon as healthy: start-up, added, back up
        self._down: set[str] = set()
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._paid: deque[tuple[float, float]] = deque()  # (clock, usd) of paid probes, last hour
        self._sent_at: dict[str, float] = {}  # when each backend's last probe went out
        self._settled: set[str] = set()  # backends whose first probe since start has ended
        self._started_at: float | None = None
        self._ids = itertools.count(1)
        self.sent: Counter[tuple[str, str]] = Counter()  # (backend, outcome) for metrics

    def set_backends(self, backends: Mapping[str, CompiledBackend]) -> None:
        """Follow a (re)loaded policy: backends it adds are probed once."""
        names = set(backends)
        if self._runtime.policy.tuning.probes.on_start:
            self._pending |= names - self._known
        self._pending &= names
        self._known = names

    @property
    def idle(self) -> bool:
        """No probe in flight and none waiting for a healthy backend."""
        return not self._inflight and not (self._pending - self._down)

    def start_up_done(self) -> bool:
        """Whether every route with an SLO can be served sighted: one of its candidates is measured
        within the SLO, or each has been probed or is down. True at once with start-up probes off, and
        ``tuning.probes.startup_timeout_s`` after start whatever they found."""
        runtime = self._runtime
        settings = runtime.policy.tuning.probes
        if not settings.enabled or not settings.on_start:
            return True
        started = self._started_at
        if started is not None and runtime.clock() - started >= settings.startup_timeout_s:
            return True
        if runtime.fleet is not None and not runtime.fleet.synced:
            return False  # the fleet's measurements first: a joining replica starts from them
        return not self.start_up_waiting_for()

    def start_up_waiting_for(self) -> list[str]:
        """The routes with an SLO that still have no candidate known to meet it and an unprobed one."""
        runtime = self._runtime
        waiting = []
        for route in runtime.policy.routes.values():
            if not route.has_slo:
                continue
            views = [runtime.stats.view(name) for name in route.backends]
            if any(_within(view, route.slo.ttft_p95_ms) for view in views):
                continue
            if all(
                view.name in self._settled or view.samples or not view.healthy or view.booting
                for view in views
            ):
                continue
            waiting.append(route.name)
        return waiting

    async def run(self) -> None:
        if self._started_at is None:
            self._started_at = self._runtime.clock()
        while True:
            try:
                self.tick()
            except Exception:  # a bug here must not stop probing for the life of the process
                log.exception("probe round failed")
            await asyncio.sleep(TICK_S)

    async def close(self) -> None:
        tasks = list(self._inflight.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def tick(self) -> None:
        runtime = self._runtime
        policy = runtime.policy
        now = runtime.clock()
        settings = policy.tuning.probes
        if not settings.enabled:
            return
        watched = {name for route in policy.routes.values() if route.has_slo for name in route.backends}
        for name, backend in policy.backends.items():
            view = runtime.stats.view(name)
            if not view.healthy or view.booting:
                self._down.add(name)
                continue
            if name in self._down:  # back up: measure it before users meet it
                self._down.discard(name)
                self._pending.add(name)
            if name in self._inflight or view.paused_until is not None:
                continue
            bar = recovery_bar(name, policy.routes.values(), view.ttft_p95_s, view.decode_tokens_per_s)
            tokens = 1 if bar.decode_tokens_per_s is None else DECODE_PROBE_TOKENS
            if view.circuit == "open":
                # Re-checked at the scrape interval, not on the circuit's growing cool-down: a probe
                # that succeeds closes it (LiveStats.probe_finished).
                last = view.last_probe_at
                due = last is None or now - last >= backend.signals.interval_s
            elif not view.accepts_requests:
                continue
            else:
                interval = settings.interval_s
                sent = self._sent_at.get(name)
                probed_lately = sent is not None and now - sent < interval
                last_user = view.last_user_sample_at
                stale = last_user is None or now - last_user >= interval
                # A backend with requests in flight is measured by them: only an avoided one is probed,
                # or one a route excludes (other routes' traffic does not tell that route it is back).
                avoided = stale and view.inflight == 0
                excluded = name in watched and bar.excluded
                due = name in self._pending or (
                    name in watched and not probed_lately and (avoided or excluded)
                )
            if due and self._affordable(policy, backend, view, now, tokens):
                self._pending.discard(name)
                self._sent_at[name] = now
                task = asyncio.get_running_loop().create_task(self._probe(backend, bar), name=f"probe:{name}")
                self._inflight[name] = task

    def _affordable(
        self, policy: CompiledPolicy, backend: CompiledBackend, view: BackendView, now: float, tokens: int
    ) -> bool:
        """A pool's probe costs nothing extra while it has headroom; a paid API's comes out of the
        policy's probe budget."""
        if backend.pool_price is not None:
            waiting = view.signals.waiting if view.signals is not None else None
            return view.inflight < backend.max_concurrency and not waiting
        while self._paid and self._paid[0][0] < now - SECONDS_PER_HOUR:
            self._paid.popleft()
        spent = sum(usd for _, usd in self._paid)
        prices = backend.token_prices
        estimate = 0.0 if prices is None else PROBE_PROMPT_TOKENS * prices.input + tokens * prices.output
        return spent + estimate <= policy.tuning.probes.paid_budget_usd_per_hour

    async def _probe(self, backend: CompiledBackend, bar: RecoveryBar) -> None:
        runtime = self._runtime
        settings = runtime.policy.tuning.probes
        stats = runtime.stats
        ticket = stats.attempt_started(backend.name, probe=True)
        attempt = Attempt(backend=backend.name, started_at=ticket.started_at, probe=True)
        try:
            await self._send(backend, attempt, 1 if bar.decode_tokens_per_s is None else DECODE_PROBE_TOKENS)
        except AttemptFailure as exc:
            attempt.status = "timeout" if exc.kind == "timeout" else "upstream_error"
            attempt.error, attempt.http_status = exc.message, exc.http_status
            if exc.http_status == 429:
                runtime.rate_limited(backend.name, exc.retry_after)
        except asyncio.CancelledError:
            attempt.status = "cancelled"
            raise
        finally:
            if attempt.finished_at is None:
                attempt.finished_at = runtime.clock()
            stats.probe_finished(ticket, attempt, settings.recovery_probes, settings.recovery_ratio, bar)
            self._inflight.pop(backend.name, None)
            self._settled.add(backend.name)
            if runtime.fleet is not None:  # what it measured, the whole fleet (and who joins it) knows
                runtime.fleet.attempt_finished(attempt, "")
            outcome = "ok" if attempt.status == "ok" else "failed"
            self.sent[backend.name, outcome] += 1
            if stats.recovering(backend.name):
                self._pending.add(backend.name)  # confirm a recovery at once, not an interval later
            self._record(backend, attempt)

    async def _send(self, backend: CompiledBackend, attempt: Attempt, max_tokens: int) -> None:
        runtime = self._runtime
        body = orjson.dumps(
            {
                "model": backend.model,
                "messages": [{"role": "user", "content": PROBE_PROMPT}],
                "max_tokens": max_tokens,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
        wait_s = backend.timeouts.first_byte_s
        call = UpstreamCall(backend, "/chat/completions", body, True, wait_s)
        upstream = await runtime.backends.client_for(backend).open(call)
        meter = StreamMeter(attempt, client_wants_usage=False, prompt_tokens=PROBE_PROMPT_TOKENS)
        try:
            async with asyncio.timeout(wait_s):
                async for data in upstream.chunks():
                    meter.feed(data, runtime.clock())
        except TimeoutError:
            raise AttemptFailure("timeout", f"{backend.name}: probe took over {wait_s:g}s") from None
        finally:
            upstream.close()
        meter.finish(runtime.clock())
        if attempt.ttft_s is None:
            raise AttemptFailure("dropped", f"{backend.name}: probe answered no token")

    def _record(self, backend: CompiledBackend, attempt: Attempt) -> None:
        """The probe's ledger row: on no route and no key, with what it cost."""
        runtime = self._runtime
        observation = Observation(
            request_id=f"probe-{next(self._ids)}",
            route="",
            endpoint="probe",
            stream=True,
            started_at=attempt.started_at,
            decision_reason="probe",
            attempts=[attempt],
            finished_at=attempt.finished_at,
        )
        if attempt.status != "ok":
            observation.status, observation.error_type = "error", attempt.status
        if attempt.usage is not None:
            view = runtime.stats.view(backend.name)
            cost = attempt_cost(
                backend, attempt.usage, view.aggregate_tokens_per_s, view.prefill_tokens_per_s
            )
            observation.cost_usd, observation.cost_basis = cost.usd, cost.basis
            if backend.token_prices is not None:
                self._paid.append((runtime.clock(), cost.usd))
        started_wall = runtime.wall_clock() - (runtime.clock() - attempt.started_at)
        runtime.ledger.append_probe(row_of(observation, started_wall, backend.model, None))


def _within(view: BackendView, slo_ms: float | None) -> bool:
    """Measured, and within the route's TTFT SLO (a route asking only for speed: measured at all)."""
    if not view.samples:
        return False
    return slo_ms is None or (view.ttft_p95_s is not None and view.ttft_p95_s * 1000.0 <= slo_ms)
