"""Shared state behind one small interface (``interface.py``): budget counters, per-key rate windows, a
message board. ``open_store`` picks the implementation from ``STORES`` by URL scheme: ``memory`` (one
process, the default) or ``redis`` (replicas share one truth; gateway/store/redis.py is the only one
importing redis).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gateway.policy.schema import StoreSettings
from gateway.store.interface import (
    ADMITTED,
    BUCKET_S,
    LOCAL,
    WINDOW_S,
    Ask,
    Message,
    Status,
    Store,
    StoreHealth,
    StoreUnavailable,
    Verdict,
    WindowCharge,
    judge,
    shown_url,
)

__all__ = [
    "ADMITTED",
    "BUCKET_S",
    "LOCAL",
    "STORES",
    "WINDOW_S",
    "Ask",
    "Message",
    "Status",
    "Store",
    "StoreHealth",
    "StoreOptions",
    "StoreUnavailable",
    "Verdict",
    "WindowCharge",
    "judge",
    "open_store",
    "shown_url",
]


@dataclass(frozen=True, slots=True)
class StoreOptions:
    settings: StoreSettings
    url: str
    wall_clock: Callable[[], float]


def _memory(options: StoreOptions) -> Store:
    from gateway.store.memory import MemoryStore

    return MemoryStore(options.wall_clock)


def _redis(options: StoreOptions) -> Store:
    from gateway.store.redis import RedisStore  # imports redis: only when a Redis URL is configured

    return RedisStore(options.url, options.settings, options.wall_clock)


STORES: Mapping[str, Callable[[StoreOptions], Store]] = MappingProxyType(
    {"memory": _memory, "redis": _redis, "rediss": _redis}
)


def open_store(settings: StoreSettings, url: str | None, wall_clock: Callable[[], float]) -> Store:
    """The store ``url`` names (else the policy's ``store.redis_url``, else memory)."""
    chosen = url or settings.redis_url or "memory://"
    scheme = chosen.partition("://")[0].lower()
    factory = STORES.get(scheme)
    if factory is None:
        raise ValueError(f"unknown store URL scheme {scheme!r}; use one of: {', '.join(STORES)}")
    return factory(StoreOptions(settings, chosen, wall_clock))
