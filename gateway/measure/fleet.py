"""The fleet's view: every sync interval this replica's finished attempts (probes included), in-flight
counts and circuit changes go out through the store, and the other replicas' merge into LiveStats.
Decisions never wait on it: they read LiveStats, which this background task keeps current. A replica
that joins reads the fleet's recent history first (the store keeps a minute of it), and is not ready
before that first read, so it starts from the fleet's measurements.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, get_args

import orjson

from gateway.measure.health import CircuitState
from gateway.measure.prefix_index import PromptKeys
from gateway.measure.prefixes import Prefixes
from gateway.measure.stats import LiveStats
from gateway.policy.compiled import CompiledPolicy
from gateway.store import Message, Store
from gateway.values.observation import Attempt, AttemptStatus, Usage

log = logging.getLogger("gateway.measure.fleet")

STATUSES = frozenset(get_args(AttemptStatus))
OUTBOX_MAX = 5_000  # attempts kept between two syncs; past that the oldest go unshared
PREFIX_OUTBOX_MAX = 5_000  # prompts recorded in the prefix index between two syncs, likewise
CLOSE_EVENTS_FOR_S = 10.0  # an older "closed" (replayed history) says nothing about now


class Fleet:
    def __init__(
        self,
        stats: LiveStats,
        store: Store,
        policy: Callable[[], CompiledPolicy],
        clock: Callable[[], float],
        interval_s: float,
        prefixes: Prefixes | None = None,
    ) -> None:
        self._stats = stats
        # Which backend now holds which prompt: batched with the attempts, never a round trip per request.
        self._prefix_index = None if prefixes is None else prefixes.index
        if prefixes is not None:
            prefixes.recorded = self.prefix_recorded
        self._prefix_outbox: deque[tuple[str, PromptKeys, float]] = deque(maxlen=PREFIX_OUTBOX_MAX)
        self.prefixes_merged = 0
        self._store = store
        self._policy = policy
        self._clock = clock
        self._interval_s = interval_s
        self._outbox: deque[tuple[Attempt, str]] = deque(maxlen=OUTBOX_MAX)
        self._circuits_seen: dict[str, tuple[int, int]] = {}  # backend -> (opened, closed) counts
        self._remote: dict[str, tuple[float, dict[str, int]]] = {}  # replica -> (heard at, in flight)
        self.replicas_heard: set[str] = set()
        self.attempts_merged = 0
        self.synced = False  # the first exchange (the fleet's recent history) has been read

    def attempt_finished(self, attempt: Attempt, route: str) -> None:
        if attempt.finished_at is not None:
            self._outbox.append((attempt, route))

    def prefix_recorded(self, backend: str, keys: PromptKeys) -> None:
        self._prefix_outbox.append((backend, keys, self._clock()))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.sync_once()
            except Exception:  # the next tick tries again; decisions carry on with what they have
                log.exception("fleet sync failed")

    async def sync_once(self) -> None:
        now = self._clock()
        backends = self._policy().backends
        payload = {
            "o": [_encode(attempt, route, now) for attempt, route in self._outbox],
            "f": {name: n for name in backends if (n := self._stats.local_inflight(name))},
            "c": self._circuit_events(backends, now),
            # Upstream rate limits: a backend paused here (its 429's Retry-After) is paused fleet-wide.
            "p": {name: left for name in backends if (left := self._stats.paused_for(name)) > 0},
        }
        if self._prefix_outbox:
            payload["x"] = [
                [backend, now - at, keys.ends, keys.hashes, keys.client_key]
                for backend, keys, at in self._prefix_outbox
            ]
            self._prefix_outbox.clear()
        self._outbox.clear()
        for message in await self._store.exchange(orjson.dumps(payload)):
            try:
                self._merge(message, now)
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                log.warning("ignoring a malformed fleet message from replica %s: %s", message.replica, exc)
        self._apply_remote_inflight(now, backends)
        self.synced = True

    def report(self) -> dict[str, Any]:
        return {
            "replicas_heard": sorted(self.replicas_heard),
            "attempts_merged": self.attempts_merged,
            "prefixes_merged": self.prefixes_merged,
        }

    def _circuit_events(self, backends: Any, now: float) -> list[list[Any]]:
        """This replica's own circuit changes since the last sync; adopted ones are not sent back."""
        events: list[list[Any]] = []
        for name in backends:
            breaker = self._stats.circuit(name)
            seen_opened, seen_closed = self._circuits_seen.get(name, (0, 0))
            self._circuits_seen[name] = (breaker.opened_count, breaker.closed_count)
            half_open_at = breaker.half_open_at
            if breaker.opened_count > seen_opened and half_open_at is not None:
                events.append([name, "open", breaker.cooldown_s, half_open_at - now])
            elif breaker.closed_count > seen_closed and half_open_at is None:
                events.append([name, "closed", 0.0, 0.0])
        return events

    def _merge(self, message: Message, now: float) -> None:
        body = orjson.loads(message.payload)
        policy = self._policy()
        self.replicas_heard.add(message.replica)
        for record in body.get("o", ()):
            attempt, route = _decode(record, now - message.age_s)
            if attempt.backend in policy.backends and (route in policy.routes or attempt.probe):
                self._stats.merge_remote(attempt, route, attempt.finished_at or now)
                self.attempts_merged += 1
        index = self._prefix_index
        for backend, age, ends, hashes, client_key in body.get("x", ()):
            if index is not None and backend in policy.backends and len(ends) == len(hashes):
                keys = PromptKeys(
                    tuple(int(e) for e in ends),
                    tuple(int(h) for h in hashes),
                    None if client_key is None else str(client_key),
                )
                index.record(str(backend), keys, now - message.age_s - float(age))
                self.prefixes_merged += 1
        if message.age_s <= 3 * self._interval_s:
            inflight = {str(k): int(v) for k, v in body.get("f", {}).items()}
            self._remote[message.replica] = (now, inflight)
        for name, left_s in body.get("p", {}).items():
            if name in policy.backends and float(left_s) - message.age_s > 0:
                self._stats.pause(name, now + float(left_s) - message.age_s)
        for name, state, cooldown_s, left_s in body.get("c", ()):
            if name not in policy.backends or state not in ("open", "closed"):
                continue
            circuit: CircuitState = "open" if state == "open" else "closed"
            if circuit == "open" or message.age_s <= CLOSE_EVENTS_FOR_S:
                self._stats.adopt_circuit(name, circuit, float(cooldown_s), float(left_s) - message.age_s)

    def _apply_remote_inflight(self, now: float, backends: Any) -> None:
        """Sum the other replicas' in-flight counts; a replica silent for a few syncs counts as none."""
        fresh_after = now - 3 * self._interval_s - 1.0
        totals: dict[str, int] = {}
        for replica, (heard_at, inflight) in list(self._remote.items()):
            if heard_at < fresh_after:
                del self._remote[replica]
                continue
            for name, count in inflight.items():
                totals[name] = totals.get(name, 0) + count
        for name in backends:
            self._stats.set_remote_inflight(name, totals.get(name, 0))


def _encode(attempt: Attempt, route: str, now: float) -> list[Any]:
    usage = attempt.usage
    return [
        attempt.backend,
        route,
        now - (attempt.finished_at or now),  # age, since clocks differ between processes
        attempt.status,
        attempt.http_status,
        attempt.ttft_s,
        attempt.first_answer_s,
        attempt.decode_tokens_per_s,
        attempt.duration_s or 0.0,
        None if usage is None else usage.completion_tokens,
        attempt.probe,
    ]


def _decode(record: list[Any], sent_at: float) -> tuple[Attempt, str]:
    """An Attempt that teaches LiveStats what the original did: same timings, speed and length."""
    # A replica of an older version sends no probe flag: its records are users' attempts.
    backend, route, age, status, http_status, ttft, first_answer, tps, duration, tokens = record[:10]
    probe = len(record) > 10 and record[10] is True
    if status not in STATUSES:
        raise ValueError(f"unknown attempt status {status!r}")
    finished_at = sent_at - float(age)
    usage = None if tokens is None else Usage(completion_tokens=int(tokens))
    # decode_tokens_per_s is (tokens - 1) / decode_s: choose decode_s to give back the same speed.
    decode_s = (int(tokens) - 1) / float(tps) if tps and tokens and int(tokens) > 1 else 0.0
    attempt = Attempt(
        backend=str(backend),
        started_at=finished_at - float(duration),
        status=status,
        http_status=None if http_status is None else int(http_status),
        ttft_s=None if ttft is None else float(ttft),
        first_answer_s=None if first_answer is None else float(first_answer),
        finished_at=finished_at,
        decode_s=decode_s,
        usage=usage,
        probe=probe,
    )
    return attempt, str(route)
