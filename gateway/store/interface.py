"""The store's one small interface and its values: budget counters, per-key rate windows, a message
board (``Store``), what an admission asks and is told (``Ask``, ``Verdict``), and ``judge``, the
admission rule both implementations apply. Below the package and its implementations, which all use it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from gateway.errors import GatewayError

WINDOW_S = 60  # rate limits hold over any sliding minute ...
BUCKET_S = 1  # ... counted in one-second buckets
LOCAL = -1  # ``held_in`` of a reservation this replica holds by itself (shared store unreachable)
Status = Literal["ok", "limited", "exhausted"]


class StoreUnavailable(GatewayError):
    """The shared store is down and the policy says fail closed: 503, never a guess."""

    status = 503
    type = "service_unavailable"
    code = "store_unavailable"

    def headers(self) -> dict[str, str]:
        return {"retry-after": "1"}


@dataclass(frozen=True, slots=True)
class WindowCharge:
    """``amount`` against a limit per sliding minute, e.g. one request of a key's 60 per minute."""

    key: str
    limit: float
    amount: float


@dataclass(frozen=True, slots=True)
class Ask:
    """One admission: every window must take its charge, and the first of ``levels`` that fits every
    cap (``keys`` with ``limits``) is reserved on all of them; all of it happens, or none of it."""

    windows: tuple[WindowCharge, ...] = ()
    keys: tuple[str, ...] = ()
    limits: tuple[float, ...] = ()
    levels: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    level: int = -1  # index into Ask.levels that was reserved; -1 when there are no caps
    window: int = -1  # index into Ask.windows that refused
    retry_after_s: float = 0.0
    bucket: int = 0  # where the window charges went, for settling token counts later
    held_in: int = 0  # the shared store's epoch, or LOCAL


ADMITTED = Verdict("ok")


@dataclass(frozen=True, slots=True)
class Message:
    """What another replica published, and how long ago."""

    replica: str
    payload: bytes
    age_s: float


@dataclass(slots=True)
class StoreHealth:
    kind: str
    on_failure: str = "fail_open"
    up: bool = True
    fault: str | None = None  # why it is down, in words that name no address or credential
    faults: int = 0  # failed store operations since start

    @property
    def serving(self) -> bool:
        """Whether requests may be admitted: the store answers, or the policy allows local counts."""
        return self.up or self.on_failure == "fail_open"

    def unavailable(self) -> StoreUnavailable:
        return StoreUnavailable(
            f"the gateway's shared state store is unavailable ({self.fault or 'unreachable'}) and its "
            "policy says fail_closed: no request is admitted until it is back"
        )


class Store(Protocol):
    """Counters under string keys are (spent, reserved) pairs in USD; windows count per second.

    ``admit`` is atomic over every key it touches and costs at most one round trip; ``settle`` and
    ``settle_window`` never block the event loop (a networked store queues them and applies each
    exactly once). ``exchange`` posts this replica's message and returns the other replicas' new ones.
    """

    health: StoreHealth
    shared: bool  # whether other processes see the same state

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def admit(self, ask: Ask) -> Verdict: ...

    def settle(self, keys: Sequence[str], reserved: float, actual: float, held_in: int = 0) -> None: ...

    def settle_window(self, key: str, bucket: int, delta: float, held_in: int = 0) -> None: ...

    def seed(self, key: str, spent: float) -> None: ...

    def reseed_from(self, totals: Callable[[float], Mapping[str, float]], shared: bool) -> None: ...

    def read(self, key: str) -> tuple[float, float]: ...

    async def exchange(self, outgoing: bytes | None) -> list[Message]: ...

    def report(self) -> dict[str, Any]: ...


def judge(
    ask: Ask, windows: Sequence[Mapping[int, float]], counters: Sequence[tuple[float, float]], now: float
) -> Verdict:
    """The admission rule over current counts (the Redis script implements the same rule in Lua).

    A cap already reached refuses even a request predicted to cost nothing.
    """
    bucket = int(now // BUCKET_S)
    oldest = bucket - WINDOW_S // BUCKET_S + 1
    for index, (charge, buckets) in enumerate(zip(ask.windows, windows, strict=True)):
        live = sorted((b, n) for b, n in buckets.items() if b >= oldest)
        excess = sum(n for _, n in live) + charge.amount - charge.limit
        if excess > 0:
            return Verdict("limited", window=index, retry_after_s=_wait(live, excess, now), bucket=bucket)
    if not ask.keys:
        return Verdict("ok", bucket=bucket)
    for level, amount in enumerate(ask.levels):
        if all(
            spent + reserved < limit and spent + reserved + amount <= limit
            for (spent, reserved), limit in zip(counters, ask.limits, strict=True)
        ):
            return Verdict("ok", level=level, bucket=bucket)
    return Verdict("exhausted", bucket=bucket)


def _wait(live: Sequence[tuple[int, float]], excess: float, now: float) -> float:
    """Seconds until enough of the oldest buckets leave the window to make room."""
    for bucket, count in live:
        excess -= count
        if excess <= 0:
            return max(0.0, (bucket + WINDOW_S // BUCKET_S) * BUCKET_S - now)
    return float(WINDOW_S)


def shown_url(url: str) -> str:
    """The URL without user or password, for /ready and logs."""
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.rpartition("@")[2] if sep else url
