"""One client request as one object, from arrival to settlement: the ``Exchange``.

It holds everything the request owns: the policy snapshot it started with (nothing reads the
runtime's policy after that), the caller's key, the parsed request, the decision, its reservations
(budget, rate limit), its attempts and the watch on the client's connection. It is settled exactly
once (``settle``), whichever way the request ends: answered, refused, failed, or left by its client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from gateway.backends import Upstream, UpstreamCall
from gateway.doors import ClientRequest, Door
from gateway.measure.prefix_index import NO_KEYS
from gateway.measure.stats import AttemptTicket
from gateway.policy.compiled import CompiledBackend, CompiledPolicy
from gateway.policy.decide import Decision, RequestFeatures
from gateway.request.connection import ClientWatch, client_watch
from gateway.values.auth import ApiKey
from gateway.values.observation import Attempt, Observation, Usage

if TYPE_CHECKING:
    from gateway.money.budgets import Reservation
    from gateway.money.ratelimit import HeldTokens
    from gateway.runtime import Runtime
    from gateway.telemetry.tracer import RequestTrace

Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]


class Exchange:
    __slots__ = (
        "_client_watch",
        "_current",
        "_task",
        "_uncounted",
        "_upstream",
        "_watcher",
        "answering",
        "budget",
        "client",
        "client_gone",
        "decision",
        "door",
        "in_flight",
        "key",
        "observation",
        "order",
        "policy",
        "request_id",
        "response_ended",
        "runtime",
        "settled",
        "started_at",
        "stopped",
        "tokens",
        "trace",
    )

    def __init__(self, runtime: Runtime, door: Door, request_id: str) -> None:
        self.runtime = runtime
        self.policy: CompiledPolicy = runtime.policy  # the snapshot: the only read of the live policy
        self.door = door  # the API the client speaks
        self.request_id = request_id
        self.started_at = runtime.clock()
        self.key: ApiKey | None = None
        # Holds one of the process's places in flight until settled (runtime.admission).
        self.in_flight = False
        self.client: ClientRequest | None = None
        self.observation: Observation | None = None  # once the request names a route
        self.decision: Decision | None = None
        self.order: tuple[str, ...] = ()  # the backends it may try, in order, once admitted
        self.budget: Reservation | None = None
        self.tokens: HeldTokens | None = None
        self.client_gone = False
        self.response_ended = False  # the client has the whole response: a hang-up now is normal
        self.answering = False  # its answer is going out: a graceful stop now ends it through its upstream
        self.stopped = False  # a graceful stop's grace ran out before this request's answer began
        self.settled = False
        self.trace: RequestTrace | None = None  # its OpenTelemetry trace, when tracing is on and sampled
        self._current: tuple[Attempt, AttemptTicket] | None = None
        self._upstream: Upstream | None = None  # the attempt in flight's open answer
        self._watcher: asyncio.Task[None] | None = None  # where the server offers no ClientWatch
        self._client_watch: ClientWatch | None = None
        self._task: asyncio.Task[Any] | None = asyncio.current_task()
        self._uncounted: Observation | None = None  # settled, its metrics not yet counted (``count``)

    # -- the client's connection -----------------------------------------------------------------

    def watch_client(self, scope: MutableMapping[str, Any], receive: Receive) -> None:
        """From now on (the body has been read), a client that hangs up cancels this request's task,
        wherever it waits: for the first byte, for a whole answer, or between chunks. Its upstream
        connection is then cut, which frees the backend's slot. Told by the connection itself where the
        server offers it (``request.connection.ClientWatch``), else by a task awaiting ``receive``."""
        if self._task is None:  # else the task it was made in, which is this one
            self._task = asyncio.current_task()
        watch = client_watch(scope)
        if watch is not None:
            watch.watch(self._client_left)
            self._client_watch = watch
        else:
            self._watcher = asyncio.get_running_loop().create_task(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._client_left()
                return

    def _client_left(self) -> None:
        task = self._task
        if not self.response_ended and not self.settled and task is not None and not task.done():
            self.client_gone = True
            task.cancel()

    def absorb_cancel(self) -> bool:
        """Whether a CancelledError in this request's task was the client leaving or the end of a graceful
        stop's grace (then it is absorbed: an answered end, not an application error) rather than the
        server's own shutdown (re-raise it)."""
        task = asyncio.current_task()
        if not (self.client_gone or self.stopped) or task is None:
            return False
        task.uncancel()
        return True

    # -- attempts --------------------------------------------------------------------------------

    def begin_attempt(self, backend: str) -> Attempt:
        observation = self.observation
        assert observation is not None, "an attempt needs a routed request"
        ticket = self.runtime.stats.attempt_started(backend)
        attempt = Attempt(backend=backend, started_at=ticket.started_at)
        observation.attempts.append(attempt)
        self._current = (attempt, ticket)
        return attempt

    def call(
        self, backend: CompiledBackend, path: str, body: bytes, stream: bool, wait_s: float
    ) -> UpstreamCall:
        """The call of the attempt in flight; with tracing on, with the trace context for an engine that
        takes it (built here at once: copying the frozen call to add it cost 1.5 us)."""
        trace, observation = self.trace, self.observation
        if trace is None or observation is None:
            return UpstreamCall(backend, path, body, stream, wait_s)
        headers = trace.headers(backend, len(observation.attempts) - 1)
        return UpstreamCall(backend, path, body, stream, wait_s, headers)

    async def open(self, call: UpstreamCall) -> Upstream:
        """Send the attempt in flight to its backend; its answer is closed when the attempt ends."""
        upstream = await self.runtime.backends.client_for(call.backend).open(call)
        self._upstream = upstream
        return upstream

    def release_upstream(self) -> None:
        """The open upstream answer is no longer the exchange's to close: a finished stream's, read to its
        end and closed by the relay after the exchange has settled (``StreamRelay``)."""
        self._upstream = None

    def cut_upstream(self) -> None:
        """Close the open upstream answer: whatever reads it sees the stream end (a stop's grace is over)."""
        if self._upstream is not None:
            self._upstream.close()

    def stop(self) -> None:
        """A graceful stop's grace is over. A stream being relayed has its upstream cut, so the relay ends
        it with an error event; a request still waiting for its answer (its first byte, a whole answer, a
        place in the queue) is cancelled where it waits and answered 503, which a client may retry."""
        if self.answering:
            self.cut_upstream()
            return
        task = self._task
        if not self.settled and not self.stopped and task is not None and not task.done():
            self.stopped = True
            task.cancel()

    def end_attempt(self) -> None:
        """Close the attempt in flight's upstream (reused when read to its end, cut otherwise, which
        frees the backend's slot) and feed the attempt to stats and costs; a no-op when none is."""
        upstream, self._upstream = self._upstream, None
        if upstream is not None:
            upstream.close()
        current, self._current = self._current, None
        if current is None or self.observation is None:
            return
        attempt, ticket = current
        if attempt.finished_at is None:
            attempt.finished_at = self.runtime.clock()
        self.runtime.attempt_finished(self.policy, self.observation, attempt, ticket)

    def cost_so_far(self, attempt: Attempt, usage: Usage) -> tuple[float, str | None]:
        """What the request has cost with ``attempt`` at its final ``usage`` (the client's usage object)."""
        assert self.observation is not None
        return self.runtime.cost_so_far(self.policy, self.observation, attempt, usage)

    # -- admission -------------------------------------------------------------------------------

    async def admit(self) -> tuple[str, ...]:
        """Reserve the request's budget and rate limits; it holds them until it settles. Returns the
        backends it may try."""
        client, observation, decision = self.client, self.observation, self.decision
        assert client is not None and observation is not None and decision is not None
        self.order, self.budget, self.tokens = await self.runtime.admit(
            self.policy, client.route, observation, decision, client.prompt_tokens
        )
        return self.order

    async def wait_for_candidate(self) -> tuple[str, ...]:
        """Wait in the route's queue for a candidate to free (``BackendsBusy`` past its bound); returns
        the new decision's order."""
        client, observation = self.client, self.observation
        assert client is not None and observation is not None
        route = client.route
        features = RequestFeatures(route.name, client.prompt_tokens, client.max_tokens, client.stream)
        deadline = self.started_at + route.fallback.deadline_s
        began = self.runtime.clock()
        try:
            decision = await self.runtime.wait_for_candidate(
                self.policy, route, observation, features, deadline, client.keys
            )
        finally:  # a wait that ended in a 429 is in the trace too
            if self.trace is not None:
                self.trace.waited(began, self.runtime.clock())
        self.order = self.decided(decision).order
        return decision.order

    def decided(self, decision: Decision) -> Decision:
        """The route's decision for this request, also taken into its trace at once."""
        self.decision = decision
        if self.trace is not None:
            self.trace.decided(decision)
        return decision

    # -- the end ---------------------------------------------------------------------------------

    def count(self) -> None:
        """The metrics of a request settled with ``count_later``; a no-op otherwise, or once done."""
        observation, self._uncounted = self._uncounted, None
        if observation is not None:
            self.runtime.metrics.request_finished(observation)
            self._finish_trace(observation)

    def fail(self, error_type: str) -> None:
        """The request ends in an error the client is told about (the first one named counts)."""
        observation = self.observation
        if observation is not None and observation.error_type is None:
            observation.status = "error"
            observation.error_type = error_type

    def settle(self, *, count_later: bool = False) -> None:
        """Close the books on this request, once: the attempt in flight, the reservations, the ledger
        row, live spend and metrics. Safe to call from every exit; only the first call acts. With
        ``count_later``, the metrics wait for ``count``: a whole answer's write need not wait for them
        (~20 us of a c=1 request's added latency, issue 39), and no reader needs them before it; nor
        its trace's spans, written then too."""
        if self.settled:
            return
        self.settled = True
        if self.in_flight:  # its place goes to the next request (a stream's at its end)
            self.runtime.in_flight.leave()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._client_watch is not None:
            self._client_watch.cancel()
            self._client_watch = None
        # The watcher's coroutine holds this exchange, and this exchange the watcher: without the cut,
        # every request would be a reference cycle left to the collector (tests/test_no_cycles.py).
        self._watcher = self._task = None
        observation = self.observation
        if self._current is not None:
            attempt = self._current[0]
            if (self.client_gone or self.stopped) and attempt.status == "ok":
                attempt.status = "cancelled"
            self.end_attempt()
        if observation is None:
            return  # refused before it named a route: nothing reserved, no ledger row
        observation.finished_at = self.runtime.clock()
        if self.client_gone:
            observation.status, observation.error_type = "cancelled", "client_disconnected"
        elif observation.error_type is None:
            final = observation.final
            if final is not None and final.status != "ok":
                observation.status, observation.error_type = "error", final.status
        client = self.client
        self.runtime.settle(
            self.policy,
            observation,
            self.budget,
            self.tokens,
            client.keys if client else NO_KEYS,
            count=not count_later,
        )
        if count_later:
            self._uncounted = observation  # its metrics and its trace: after the answer's write
        else:
            self._finish_trace(observation)

    def _finish_trace(self, observation: Observation) -> None:
        if self.trace is not None:
            client = self.client
            self.trace.finish(observation, self.decision, client.payload if client else None, self.policy)
