"""Synthetic probes: one short prompt with ``max_tokens: 1`` that keeps a backend's TTFT and health
measured while routing avoids it, so the gateway learns without spending users' requests and notices
a recovery. Which backend is due when is ``probe_plan.py``'s (the simulator follows the same rules);
this module sends them off the request path. Probes are counted apart (stats, metrics, the fleet, and
the ledger's ``probes`` table: billed to no route and no key).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import orjson

from gateway.backends import UpstreamCall
from gateway.errors import AttemptFailure
from gateway.ledger import row_of
from gateway.measure.meter import StreamMeter
from gateway.measure.probe_plan import PROBE_PROMPT_TOKENS, DueProbe, ProbePlan
from gateway.money.costs import attempt_cost
from gateway.policy.compiled import CompiledBackend, CompiledPolicy
from gateway.values.observation import Attempt, Observation

if TYPE_CHECKING:
    from gateway.backends import Backends
    from gateway.ledger import Ledger
    from gateway.measure.fleet import Fleet
    from gateway.measure.stats import LiveStats
    from gateway.telemetry.tracer import Tracer

log = logging.getLogger("gateway.probes")

TICK_S = 0.05  # real seconds between looks at what is due; probes themselves run at the policy's pace
PROBE_PROMPT = "Reply with one word."


class Prober:
    """Sends the probes that the plan says are due, off the request path."""

    def __init__(
        self,
        policy: Callable[[], CompiledPolicy],
        stats: LiveStats,
        backends: Backends,
        ledger: Ledger,
        fleet: Fleet | None,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        rate_limited: Callable[[str, str | None], None],
    ) -> None:
        self._policy, self._stats, self._backends, self._ledger = policy, stats, backends, ledger
        self._fleet, self._clock, self._wall_clock = fleet, clock, wall_clock
        self._rate_limited = rate_limited  # an upstream 429 pauses the backend, as a user's would
        self._plan = ProbePlan()
        self._inflight: dict[str, asyncio.Task[None]] = {}
        self._ids = itertools.count(1)
        self.sent: Counter[tuple[str, str]] = Counter()  # (backend, outcome) for metrics
        self.tracer: Tracer | None = None  # each probe a trace of its own, when tracing is on

    def set_backends(self, backends: Mapping[str, CompiledBackend]) -> None:
        """Follow a (re)loaded policy: backends it adds are probed once."""
        self._plan.set_backends(backends, self._policy().tuning.probes.on_start)

    @property
    def idle(self) -> bool:
        """No probe in flight and none waiting for a healthy backend."""
        return self._plan.idle(self._inflight)

    def start_up_done(self) -> bool:
        """Whether every route with an SLO can be served sighted: one of its candidates is measured
        within the SLO, or each has been probed or is down; and, in a fleet, the fleet's measurements
        have been read. True at once with start-up probes off, and ``tuning.probes.startup_timeout_s``
        after start whatever they found."""
        if self._fleet is not None and not self._fleet.synced and not self._timed_out():
            return False  # the fleet's measurements first: a joining replica starts from them
        return self._plan.start_up_done(self._policy(), self._stats.view, self._clock())

    def start_up_waiting_for(self) -> list[str]:
        """The routes with an SLO that have no candidate measured within it and one not yet probed."""
        return self._plan.start_up_waiting_for(self._policy(), self._stats.view)

    def _timed_out(self) -> bool:
        started = self._plan.started_at
        timeout = self._policy().tuning.probes.startup_timeout_s
        return started is not None and self._clock() - started >= timeout

    async def run(self) -> None:
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
        policy, stats = self._policy(), self._stats
        loop = asyncio.get_running_loop()
        needed = policy.tuning.probes.recovery_probes
        for name, bar in self._plan.bars(policy, stats.view).items():
            stats.set_recovery_bar(name, bar, needed)
        for due in self._plan.due(policy, stats.view, self._clock(), self._inflight):
            name = due.backend.name
            self._inflight[name] = loop.create_task(self._probe(due), name=f"probe:{name}")

    async def _probe(self, due: DueProbe) -> None:
        backend = due.backend
        settings = self._policy().tuning.probes
        stats = self._stats
        ticket = stats.attempt_started(backend.name, probe=True)
        attempt = Attempt(backend=backend.name, started_at=ticket.started_at, probe=True)
        try:
            await self._send(backend, attempt, due.max_tokens)
        except AttemptFailure as exc:
            attempt.status = "timeout" if exc.kind == "timeout" else "upstream_error"
            attempt.error, attempt.http_status = exc.message, exc.http_status
            if exc.http_status == 429:
                self._rate_limited(backend.name, exc.retry_after)
        except asyncio.CancelledError:
            attempt.status = "cancelled"
            raise
        finally:
            if attempt.finished_at is None:
                attempt.finished_at = self._clock()
            stats.probe_finished(ticket, attempt, settings.recovery_probes, settings.recovery_ratio, due.bar)
            self._inflight.pop(backend.name, None)
            self._plan.finished(backend.name, stats.recovering(backend.name))
            if self._fleet is not None:  # what it measured, the whole fleet (and who joins it) knows
                self._fleet.attempt_finished(attempt, "")
            outcome = "ok" if attempt.status == "ok" else "failed"
            self.sent[backend.name, outcome] += 1
            self._record(backend, attempt)

    async def _send(self, backend: CompiledBackend, attempt: Attempt, max_tokens: int) -> None:
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
        upstream = await self._backends.client_for(backend).open(call)
        meter = StreamMeter(attempt, client_wants_usage=False, prompt_tokens=PROBE_PROMPT_TOKENS)
        try:
            async with asyncio.timeout(wait_s):
                async for data in upstream.chunks():
                    meter.feed(data, self._clock())
        except TimeoutError:
            raise AttemptFailure("timeout", f"{backend.name}: probe took over {wait_s:g}s") from None
        finally:
            upstream.close()
        meter.finish(self._clock())
        if attempt.ttft_s is None:
            raise AttemptFailure("dropped", f"{backend.name}: probe answered no token")

    def _record(self, backend: CompiledBackend, attempt: Attempt) -> None:
        """The probe's ledger row: on no route and no key, with what it cost."""
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
            view = self._stats.view(backend.name)
            cost = attempt_cost(
                backend, attempt.usage, view.aggregate_tokens_per_s, view.prefill_tokens_per_s
            )
            observation.cost_usd, observation.cost_basis = cost.usd, cost.basis
            if backend.token_prices is not None:
                self._plan.paid(self._clock(), cost.usd)
        started_wall = self._wall_clock() - (self._clock() - attempt.started_at)
        self._ledger.append_probe(row_of(observation, started_wall, backend.model, None))
        if self.tracer is not None:
            self.tracer.probe(observation, backend)
