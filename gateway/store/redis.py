"""The Redis store: every replica's budgets, rate windows and messages in one Redis (the only module
that imports redis). Admission is one EVALSHA; settlements go in numbered batches applied exactly once;
while Redis is unreachable the policy's ``on_failure`` decides, and local counts are added back later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from gateway.policy.schema import StoreSettings
from gateway.store.interface import ADMITTED, LOCAL, WINDOW_S, Ask, Message, StoreHealth, Verdict, shown_url
from gateway.store.memory import MemoryStore
from gateway.store.outage import Batch, LedgerTotals, OutageShares, Replicas
from gateway.store.scripts import ADMIT_LUA, FLOOR_LUA, SETTLE_LUA, admit_args

log = logging.getLogger("gateway.store")

FAULTS = (RedisError, OSError, asyncio.TimeoutError)
COUNTER_TTL_S = 62 * 86_400  # a month's counter outlives its month
HISTORY_MS = 60_000  # a new replica starts from the fleet's last minute of messages
STREAM_MAXLEN = 10_000
FLOOR_AGAIN_FOR_S = 30.0  # after Redis lost its data, how long its counters keep the ledger as a floor
REFRESH_S = 1.0  # how often counters read by metrics and the dashboard are re-read
PROBE_S = 0.5  # how often an unreachable Redis is tried again
WATCH_FOR_S = 600.0  # a counter nobody read for this long is no longer re-read
# Connections per process: admissions past this many at once wait for one (a local queue, not a fault).
POOL_SIZE = 64


class RedisStore:
    """Keys that one script touches share the ``{admission}`` hash tag, so every admission (budgets of
    routes and keys, rate windows) is one atomic script on one Redis Cluster slot; fleet messages
    live under ``{fleet}``."""

    shared = True

    def __init__(
        self, url: str, settings: StoreSettings, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self._url = url
        self._timeout_s = settings.timeout_ms / 1000.0
        self._wall_clock = wall_clock
        self._tag = f"{settings.key_prefix}{{admission}}:"
        self._stream = f"{settings.key_prefix}{{fleet}}:messages"
        self.replica = os.urandom(6).hex()
        self._applied_key = f"{self._tag}applied:{self.replica}"
        self.health = StoreHealth("redis", settings.on_failure)
        self._local = MemoryStore(wall_clock)  # reservations and windows held while Redis is away
        self._epoch = 0  # counts the times Redis was found to have lost our data
        self._shared: dict[str, tuple[float, float]] = {}  # counters as Redis last told us
        self._pending = Batch()
        self._sending: Batch | None = None  # sent, not acknowledged: resent as is until it is
        self._seq = self._acked = 0
        self._admissions = 0
        self._contributed: dict[str, float] = {}  # spend of ours that Redis holds, per counter
        self._watched: dict[str, float] = {}
        self._refreshed_at = 0.0
        self._last_id: str | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._client: Redis | None = None
        self._admit: Any = None
        self._settle: Any = None
        self._floor: Any = None
        # Redis away or found empty (gateway.store.outage): shares while away, the ledger's floor after.
        self._replicas = Replicas(time.monotonic)
        self._outage = OutageShares()
        self._ledger_totals: LedgerTotals | None = None
        self._ledger_shared = False
        self._floor_due = False
        self._floor_until = 0.0  # after a loss, the floor is raised again each refresh until then
        self.floors_raised = 0  # counters the ledger's totals raised (Redis had lost them)

    async def start(self) -> None:
        retry = Retry(NoBackoff(), 0)  # a fault is reported at once; the background probe reconnects
        pool = BlockingConnectionPool.from_url(
            self._url,
            max_connections=POOL_SIZE,
            timeout=max(1.0, 10 * self._timeout_s),
            socket_timeout=self._timeout_s,
            socket_connect_timeout=self._timeout_s,
            retry=retry,
        )
        self._client = Redis(connection_pool=pool, retry=retry)
        self._admit = self._client.register_script(ADMIT_LUA)
        self._settle = self._client.register_script(SETTLE_LUA)
        self._floor = self._client.register_script(FLOOR_LUA)
        log.info("sharing budgets, rate limits and live stats through %s", shown_url(self._url))
        try:
            await self._client.ping()
        except FAULTS as exc:
            self._fault(exc)
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        # Let the background task finish what it is sending: cancelling a command in flight can
        # leave redis-py's connection (and our batch) in between.
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=max(1.0, 10 * self._timeout_s))
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.health.up and (self._pending or self._sending):
            with contextlib.suppress(*FAULTS):
                await asyncio.wait_for(self._flush(), timeout=max(1.0, 10 * self._timeout_s))
        if self._client is not None:
            await self._client.aclose()
            await self._client.connection_pool.disconnect()

    async def admit(self, ask: Ask) -> Verdict:
        if not ask.windows and not ask.keys:
            return ADMITTED
        if self.health.up:
            self._admissions += 1
            marker = f"reservation:{self.replica}:{self._admissions}"
            keys = [self._tag + key for key in (*(c.key for c in ask.windows), *ask.keys)]
            try:
                reply = await self._admit(
                    keys=[*keys, self._tag + marker], args=admit_args(ask, COUNTER_TTL_S)
                )
            except FAULTS as exc:
                self._fault(exc)
                if ask.keys:  # a slow Redis may run the script after we gave up on it
                    self._pending.cancels.append((marker, ask.keys))
            else:
                return self._verdict(ask, reply)
        if not self.health.serving:
            raise self.health.unavailable()
        replicas = self._replicas.count()
        counters = self._outage.counters(ask.keys, ask.limits, self.read, replicas)
        return self._local.admit_now(ask, held_in=LOCAL, counters_of=counters)

    def settle(self, keys: Sequence[str], reserved: float, actual: float, held_in: int = 0) -> None:
        release = reserved if held_in == self._epoch else 0.0
        for key in keys:
            if held_in == LOCAL:
                self._local.release(key, reserved)
            if actual or release:
                delta = self._pending.counters.setdefault(key, [0.0, 0.0])
                delta[0] += actual
                delta[1] -= release
        self._wake.set()

    def settle_window(self, key: str, bucket: int, delta: float, held_in: int = 0) -> None:
        if held_in == LOCAL:
            self._local.settle_window(key, bucket, delta)
        elif held_in == self._epoch and delta:
            windows = self._pending.windows
            windows[(key, bucket)] = windows.get((key, bucket), 0.0) + delta
            self._wake.set()

    def seed(self, key: str, spent: float) -> None:
        """What the ledger says until Redis has said anything (it holds the fleet's counters)."""
        self._shared.setdefault(key, (spent, 0.0))

    def reseed_from(self, totals: LedgerTotals, shared: bool) -> None:
        """Where the counters' floor comes from when Redis is found empty; checked once now too."""
        self._ledger_totals, self._ledger_shared = totals, shared
        self._floor_due = True
        self._wake.set()

    def read(self, key: str) -> tuple[float, float]:
        """Redis's last word on a counter plus what this replica has not yet sent; re-read in the
        background while someone keeps asking."""
        self._watched[key] = self._wall_clock()
        spent, reserved = self._shared.get(key, (0.0, 0.0))
        for batch in (self._sending, self._pending):
            delta = None if batch is None else batch.counters.get(key)
            if delta is not None:
                spent += delta[0]
                reserved += delta[1]
        return spent, max(0.0, reserved) + self._local.read(key)[1]

    async def exchange(self, outgoing: bytes | None) -> list[Message]:
        if not self.health.up or self._client is None:
            return []
        try:
            if self._last_id is None:
                seconds, micros = await self._client.time()
                self._last_id = f"{seconds * 1000 + micros // 1000 - HISTORY_MS}-0"
            pipe = self._client.pipeline(transaction=False)
            if outgoing is not None:
                fields: dict[Any, Any] = {"r": self.replica, "d": outgoing}
                pipe.xadd(self._stream, fields, maxlen=STREAM_MAXLEN, approximate=True)
            pipe.xread({self._stream: self._last_id}, count=1000)
            pipe.time()
            *_, read, (seconds, micros) = await pipe.execute()
        except FAULTS as exc:
            self._fault(exc)
            return []
        now_ms = seconds * 1000 + micros // 1000
        messages = []
        for _, entries in read or ():
            for entry_id, entry in entries:
                self._last_id = entry_id.decode()
                replica = entry[b"r"].decode()
                if replica != self.replica:
                    self._replicas.heard(replica)
                    age_s = max(0.0, (now_ms - int(self._last_id.partition("-")[0])) / 1000.0)
                    messages.append(Message(replica, entry[b"d"], age_s))
        return messages

    def report(self) -> dict[str, Any]:
        health = self.health
        return {
            "kind": "redis",
            "shared": True,
            "replica": self.replica,
            "up": health.up,
            "on_failure": health.on_failure,
            "fault": health.fault,
            "faults": health.faults,
            "unsent_batches": int(bool(self._pending)) + int(self._sending is not None),
            "replicas_heard": self._replicas.count(),
            "counters_raised_to_ledger": self.floors_raised,
            "data_lost": self._epoch,  # times Redis was found to have lost this replica's counts
        }

    # --- background: send settlements, re-read watched counters, probe while down -------------------

    async def _run(self) -> None:
        while not self._closing:
            self._wake.clear()
            try:
                if self.health.up:
                    await self._sync()
                elif await self._probe():
                    continue
            except Exception:  # a bug must not stop the settlements for good
                log.exception("shared store background task failed; retrying")
            delay = REFRESH_S if self.health.up else PROBE_S
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def _sync(self) -> None:
        try:
            if self._pending or self._sending:
                await self._flush()
            if self._floor_due:  # after the flush: what this replica re-added is in before the maximum
                await self._raise_to_ledger()
            if self._wall_clock() - self._refreshed_at >= REFRESH_S:
                # Rows settled around the loss reach the ledger a flush later: raised again meanwhile.
                self._floor_due |= self._wall_clock() < self._floor_until
                await self._refresh()
        except FAULTS as exc:
            self._fault(exc)

    async def _probe(self) -> bool:
        """True when Redis answers again; then the next batch (sent even if empty) tells whether Redis
        kept what this replica had sent before it went away."""
        assert self._client is not None
        try:
            await self._client.ping()
            # The pool's idle connections predate the outage: each would fail once on its first use
            # and mark the store down again (a restart flapped a replica down and up a few times).
            await self._client.connection_pool.disconnect(inuse_connections=False)
            if self._ledger_shared and self._acked and not await self._client.exists(self._applied_key):
                # Back empty: what this replica counted meanwhile is in the fleet's ledger, and the
                # ledger's floor brings it back; sent too, it would be counted twice.
                for batch in (self._sending, self._pending):
                    if batch is not None:
                        batch.counters.clear()
                        batch.cancels.clear()
            self.health.up, self.health.fault = True, None
            log.warning("shared store is reachable again; sending what was counted meanwhile")
            await self._flush(always=True)
        except FAULTS as exc:
            self._fault(exc)
            return False
        return True

    async def _flush(self, *, always: bool = False) -> None:
        if self._sending is None:
            if not self._pending and not always:
                return
            self._seq += 1
            self._sending, self._pending = self._pending, Batch()
            self._sending.seq = self._seq
        batch = self._sending
        counters = list(batch.counters.items())
        windows = list(batch.windows.items())
        keys = [self._applied_key, *(self._tag + key for key, _ in counters)]
        keys += [self._tag + key for (key, _), _ in windows]
        args: list[Any] = [
            batch.seq,
            len(counters),
            len(windows),
            len(batch.cancels),
            COUNTER_TTL_S,
            WINDOW_S,
        ]
        for _, (spent, reserved) in counters:
            args += [repr(spent), repr(reserved)]
        for (_, bucket), delta in windows:
            args += [bucket, repr(delta)]
        for marker, caps in batch.cancels:
            keys += [self._tag + key for key in (marker, *caps)]
            args.append(len(caps))
        assert self._settle is not None
        reply = await self._settle(keys=keys, args=args)
        previous = int(reply[0])
        for i, (key, _) in enumerate(counters):
            self._shared[key] = (float(reply[1 + 2 * i]), float(reply[2 + 2 * i]))
        self._sending = None
        if previous < self._acked:
            self._redis_lost_data()
        self._acked = batch.seq
        for key, (spent, _) in counters:
            self._contributed[key] = self._contributed.get(key, 0.0) + spent

    def _redis_lost_data(self) -> None:
        """Redis restarted empty: counters come back (gateway.store.outage); reservations it held are
        gone, so their settlements release nothing."""
        self._epoch += 1
        if self._ledger_totals is not None:
            self._floor_due, self._floor_until = True, self._wall_clock() + FLOOR_AGAIN_FOR_S
        how = "raising its counters to the ledger's" if self._ledger_shared else "re-adding our spend"
        log.warning("the shared store lost its data; %s", how)
        if not self._ledger_shared:  # a fleet's ledger holds this replica's spend: the floor brings it back
            for key, spent in self._contributed.items():
                self._pending.counters.setdefault(key, [0.0, 0.0])[0] += spent
        self._contributed = {}
        self._wake.set()

    async def _raise_to_ledger(self) -> None:
        assert self._ledger_totals is not None and self._floor is not None
        totals = await asyncio.to_thread(self._ledger_totals, self._wall_clock())
        if totals:
            keys = [self._tag + key for key in totals]
            raised = int(await self._floor(keys=keys, args=[COUNTER_TTL_S, *map(repr, totals.values())]))
            if raised:
                log.warning("raised %d budget counters to the ledger's totals", raised)
            self.floors_raised += raised
        self._floor_due = False

    async def _refresh(self) -> None:
        assert self._client is not None
        now = self._wall_clock()
        self._refreshed_at = now
        for key in [k for k, at in self._watched.items() if now - at > WATCH_FOR_S]:
            del self._watched[key]
        keys = list(self._watched)
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(self._tag + key, ["spent", "reserved"])
        pipe.expire(self._applied_key, 7 * 86_400)
        replies = await pipe.execute()
        for key, (spent, reserved) in zip(keys, replies, strict=False):
            self._shared[key] = (float(spent or 0.0), float(reserved or 0.0))

    # --- helpers -----------------------------------------------------------------------------------

    def _verdict(self, ask: Ask, reply: Sequence[Any]) -> Verdict:
        status, index, bucket, wait, *counters = reply
        for i, key in enumerate(ask.keys):
            self._shared[key] = (float(counters[2 * i]), float(counters[2 * i + 1]))
        if status == b"limited":
            return Verdict("limited", window=int(index), retry_after_s=float(wait), bucket=int(bucket))
        if status == b"exhausted":
            return Verdict("exhausted", bucket=int(bucket))
        return Verdict("ok", level=int(index), bucket=int(bucket), held_in=self._epoch)

    def _fault(self, exc: BaseException) -> None:
        health = self.health
        health.faults += 1
        health.fault = self._describe(exc)
        if health.up:
            health.up = False
            self._outage.began()
            log.warning("shared store fault, serving %s: %s (%r)", health.on_failure, health.fault, exc)

    def _describe(self, exc: BaseException) -> str:
        """Why, in words that carry no address or credential: /ready is unauthenticated."""
        if isinstance(exc, (RedisTimeoutError, asyncio.TimeoutError, TimeoutError)):
            return f"Redis did not answer within {self._timeout_s * 1000:.0f} ms"
        if isinstance(exc, (RedisConnectionError, OSError)):
            return "cannot connect to Redis"
        return f"Redis error ({type(exc).__name__})"
