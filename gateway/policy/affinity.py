"""Cache affinity among replicas of one pool, with load balance as its guard.

Replicas of one pool (same ``family``, same price) serve a prompt equally well but for their caches.
A prompt that only one of them holds a good part of stays there; one whose only match is a short or
shared prefix (the system prompt every conversation starts with, present everywhere or cheap to
prefill anywhere) is no reason to pick a replica, and goes by load. Affinity also gives way when the
holder is out of balance with the least loaded replica, by the SGLang router's rule (its
``cache_aware`` policy's ``cache_threshold``, ``balance_abs_threshold`` and
``balance_rel_threshold``): more than ``BALANCE_ABS`` requests and ``BALANCE_REL`` times as many. A
holder whose queue would break the TTFT SLO loses in the decision itself, which predicts that queue.
"""

from __future__ import annotations

from collections.abc import Mapping

from gateway.measure.backend_stats import BackendView
from gateway.policy.compiled import CompiledBackend

# SGLang's cache_threshold default: of the prompt, held by one replica beyond what all of them hold ...
AFFINITY_MIN_SHARE = 0.3
AFFINITY_MIN_TOKENS = 2048  # ... and at least this many tokens: less is cheap to prefill anywhere
BALANCE_ABS = 8  # requests more than the least loaded replica ...
BALANCE_REL = 1.5  # ... and this many times as many: the holder is out of balance


def occupied(backend: CompiledBackend, view: BackendView | None) -> int:
    """Requests on the replica now: the gateway's own count, or the engine's running + waiting."""
    if view is None:
        return 0
    busy = view.inflight
    signals = view.signals
    if signals is not None:
        busy = max(busy, int(signals.running or 0) + int(signals.waiting or 0))
    return busy


def load_share(backend: CompiledBackend, view: BackendView) -> float:
    """How full the replica is: occupied over its slots (the engine's, else the policy's maximum)."""
    signals = view.signals
    capacity = signals.slots_total if signals is not None and signals.slots_total else backend.max_concurrency
    return occupied(backend, view) / capacity


def replica_groups(
    names: tuple[str, ...], backends: Mapping[str, CompiledBackend]
) -> tuple[tuple[int, ...], ...]:
    """The candidates of a route that are replicas of one pool (indexes into ``names``): the same
    family at the same price. Computed once when the policy is compiled."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for index, name in enumerate(names):
        backend = backends.get(name)
        if backend is not None:
            key = (backend.family, backend.token_prices, backend.pool_price)
            groups.setdefault(key, []).append(index)
    return tuple(tuple(members) for members in groups.values() if len(members) > 1)


def by_load_groups(
    prompt_tokens: int,
    names: tuple[str, ...],
    groups: tuple[tuple[int, ...], ...],
    backends: Mapping[str, CompiledBackend],
    snapshot: Mapping[str, BackendView],
    cached: Mapping[str, int],
) -> tuple[Mapping[str, int], tuple[tuple[int, ...], ...]]:
    """The cached tokens the decision should count on, and the replica groups that go by load (all
    of them but those where one replica's cache holds enough of this prompt); ``cached`` itself comes
    back when nothing changes."""
    counted: dict[str, int] | None = None
    by_load: list[tuple[int, ...]] = []
    for members in groups:
        held = [cached.get(names[i], 0) for i in members] if cached else [0] * len(members)
        floor, top = min(held), max(held)
        if top - floor >= max(AFFINITY_MIN_TOKENS, AFFINITY_MIN_SHARE * prompt_tokens):
            loads = [occupied(backends[names[i]], snapshot.get(names[i])) for i in members]
            least, holder = min(loads), loads[held.index(top)]
            if not (holder > least + BALANCE_ABS and holder > BALANCE_REL * least):
                continue  # affinity holds: the cache decides among these replicas
        if top > floor:  # what only some of them hold counts on none of them
            if counted is None:
                counted = dict(cached)
            for i in members:
                if floor:
                    counted[names[i]] = floor
                else:
                    counted.pop(names[i], None)
        by_load.append(members)
    return (cached if counted is None else counted), tuple(by_load)
