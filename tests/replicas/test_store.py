"""The store contract, one suite over both implementations (memory, and Redis on a server of our own),
then what only a shared store does: two stores see one truth, a resent batch counts once, keys keep
to one cluster slot, and an outage is served per the policy and reconciled when Redis comes back."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import key_slot

from gateway.policy.schema import StoreSettings
from gateway.store import LOCAL, Ask, Store, StoreUnavailable, WindowCharge, open_store
from gateway.store.redis import Batch, RedisStore

from .conftest import RedisServer, key_prefix, redis_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as running:
        yield running


def settings(**overrides: object) -> StoreSettings:
    return StoreSettings.model_validate({"key_prefix": key_prefix(), "timeout_ms": 500, **overrides})


async def opened(url: str, given: StoreSettings | None = None) -> Store:
    store = open_store(given or settings(), url, time.time)
    await store.start()
    return store


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest, server: RedisServer) -> AsyncIterator[Store]:
    url = "memory://" if request.param == "memory" else server.url
    running = await opened(url)
    yield running
    await running.close()


async def eventually(condition: object, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while not await condition():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


def caps(amount: float, *levels: float) -> Ask:
    return Ask(keys=("day", "month"), limits=(1.0, 10.0), levels=(amount, *levels))


async def test_an_admission_takes_every_cap_or_none(store: Store) -> None:
    assert (await store.admit(caps(0.6))).status == "ok"
    refused = await store.admit(caps(0.6))
    assert refused.status == "exhausted", "the day cap would be exceeded"
    assert store.read("month") == (0.0, pytest.approx(0.6)), "a refusal leaves no trace on any counter"
    store.settle(["day", "month"], 0.6, 0.5)

    async def settled() -> bool:
        return store.read("day") == (pytest.approx(0.5), 0.0) and await _no_unsent(store)

    await eventually(settled)
    assert (await store.admit(caps(0.5))).status == "ok"
    store.settle(["day", "month"], 0.5, 0.5)
    assert (await store.admit(caps(0.0))).status == "exhausted", "a spent cap refuses even a free request"


async def test_the_first_level_that_fits_is_reserved(store: Store) -> None:
    verdict = await store.admit(caps(1.5, 0.9, 0.1))
    assert (verdict.status, verdict.level) == ("ok", 1), "1.5 does not fit a 1.0 cap; 0.9 does"
    assert store.read("day") == (0.0, pytest.approx(0.9))


async def test_a_window_counts_requests_and_says_when_to_retry(store: Store) -> None:
    ask = Ask(windows=(WindowCharge("ratelimit:key:k:requests", 3, 1.0),))
    assert [(await store.admit(ask)).status for _ in range(3)] == ["ok"] * 3
    refused = await store.admit(ask)
    assert (refused.status, refused.window) == ("limited", 0)
    assert 0 < refused.retry_after_s <= 60


async def test_a_token_window_settles_with_the_real_usage(store: Store) -> None:
    charge = WindowCharge("ratelimit:key:k:tokens", 100, 80.0)
    admitted = await store.admit(Ask(windows=(charge,)))
    more = Ask(windows=(WindowCharge(charge.key, 100, 30.0),))
    assert (await store.admit(more)).status == "limited", "80 reserved + 30 > 100"
    store.settle_window(charge.key, admitted.bucket, 20.0 - 80.0, admitted.held_in)

    async def fits() -> bool:
        return (await store.admit(more)).status == "ok"

    await eventually(fits)


async def test_a_refused_window_charges_nothing_and_reserves_nothing(store: Store) -> None:
    window = WindowCharge("ratelimit:key:k:requests", 1, 1.0)
    assert (await store.admit(Ask(windows=(window,)))).status == "ok"
    verdict = await store.admit(Ask(windows=(window,), keys=("day",), limits=(1.0,), levels=(0.5,)))
    assert verdict.status == "limited"
    assert store.read("day") == (0.0, 0.0)


# --- what only a shared store does ------------------------------------------------------------------


async def test_two_replicas_share_counters_and_hear_each_other(server: RedisServer) -> None:
    shared = settings()
    one, two = await opened(server.url, shared), await opened(server.url, shared)
    try:
        assert (await one.admit(caps(0.6))).status == "ok"
        assert (await two.admit(caps(0.6))).status == "exhausted", "the other replica's reservation counts"
        one.settle(["day", "month"], 0.6, 0.25)

        async def seen_by_the_other() -> bool:
            return two.read("day") == (pytest.approx(0.25), 0.0)

        await eventually(seen_by_the_other)
        await one.exchange(b"from one")
        heard = await two.exchange(b"from two")
        assert [m.payload for m in heard] == [b"from one"], "its own messages are not handed back"
        assert [m.payload for m in await one.exchange(None)] == [b"from two"]
        assert 0 <= heard[0].age_s < 5
    finally:
        await one.close()
        await two.close()


async def test_a_resent_batch_counts_once(server: RedisServer) -> None:
    store = await opened(server.url)
    assert isinstance(store, RedisStore)
    try:
        store.settle(["day"], 0.0, 0.25)

        async def flushed() -> bool:
            return store.read("day") == (pytest.approx(0.25), 0.0) and not store.report()["unsent_batches"]

        await eventually(flushed)
        # Redis applied the batch but its reply was lost: the same batch, same number, goes again.
        store._sending = Batch(seq=store._acked, counters={"day": [0.25, 0.0]})
        store.settle(["month"], 0.0, 0.0)  # wakes the sender
        await eventually(flushed)
        with server.client() as client:
            spent = client.hget(f"{store._tag}day", "spent")
        assert float(spent or 0) == pytest.approx(0.25)
    finally:
        await store.close()


async def test_keys_one_script_touches_share_one_cluster_slot(server: RedisServer) -> None:
    given = settings()
    store = await opened(server.url, given)
    try:
        ask = Ask(
            windows=(WindowCharge("ratelimit:key:team-a:requests", 10, 1.0),),
            keys=("budget:route:kimi-k3:day:2026-11-30", "budget:key:team-a:month:2026-11"),
            limits=(5.0, 50.0),
            levels=(0.1,),
        )
        verdict = await store.admit(ask)
        store.settle(ask.keys, 0.1, 0.05, verdict.held_in)
        store.settle_window(ask.windows[0].key, verdict.bucket, 0.0, verdict.held_in)
        await store.exchange(b"hello")
        await eventually(lambda: _no_unsent(store))
        with server.client() as client:
            keys = [k.decode() for k in client.scan_iter(match=f"{given.key_prefix}*")]
        admission = [k for k in keys if "{admission}" in k]
        assert len(admission) >= 4, keys  # two budget counters, a window, the applied-sequence key
        assert len({key_slot(k.encode()) for k in admission}) == 1
        assert all(k.count("{") == 1 for k in keys), "one hash tag per key"
    finally:
        await store.close()


async def _no_unsent(store: Store) -> bool:
    """Every settlement has reached the store (a networked one sends them in the background)."""
    return not store.report().get("unsent_batches")


# --- outages ----------------------------------------------------------------------------------------


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server(tmp_path) as running:
        yield running


async def test_fail_open_serves_locally_and_catches_up_when_redis_is_back(own_server: RedisServer) -> None:
    store = await opened(own_server.url)
    try:
        store.settle(["day"], 0.0, 0.25)
        await eventually(lambda: _no_unsent(store))
        own_server.stop()
        verdict = await store.admit(caps(0.5))
        assert (verdict.status, verdict.held_in) == ("ok", LOCAL), "served on local counts"
        assert not store.health.up and store.health.fault == "cannot connect to Redis"
        assert (await store.admit(caps(0.5))).status == "exhausted", "the last known spend still counts"
        store.settle(["day", "month"], 0.5, 0.25, verdict.held_in)
        own_server.start()  # same port, empty: it lost the 0.25 sent before

        async def caught_up() -> bool:
            return store.health.up and not store.report()["unsent_batches"]

        await eventually(caught_up, within_s=10)
        with own_server.client() as client:
            day = client.hget(f"{store._tag}day", "spent")
            month = client.hget(f"{store._tag}month", "spent")
        assert float(day or 0) == pytest.approx(0.5), "what it sent before plus what it counted meanwhile"
        assert float(month or 0) == pytest.approx(0.25)
        assert store.health.faults >= 1
    finally:
        await store.close()


async def test_an_admission_redis_ran_after_timing_out_is_cancelled(own_server: RedisServer) -> None:
    store = await opened(own_server.url, settings(timeout_ms=100))
    assert own_server.proc is not None
    try:
        await store.admit(Ask(keys=("warm",), limits=(1.0,), levels=(0.0,)))  # Redis has the script now
        os.kill(own_server.proc.pid, signal.SIGSTOP)  # hung, not gone: the script runs when it wakes
        try:
            verdict = await store.admit(caps(0.5))
        finally:
            os.kill(own_server.proc.pid, signal.SIGCONT)
        assert verdict.held_in == LOCAL and store.health.fault == "Redis did not answer within 100 ms"
        store.settle(["day", "month"], 0.5, 0.4, verdict.held_in)

        async def caught_up() -> bool:
            return store.health.up and await _no_unsent(store)

        await eventually(caught_up, within_s=10)
        with own_server.client() as client:
            day = client.hmget(f"{store._tag}day", ["spent", "reserved"])
        assert [float(v or 0) for v in day] == [pytest.approx(0.4), 0.0], "the late reservation was released"
    finally:
        await store.close()


async def test_fail_closed_refuses_while_redis_is_away(own_server: RedisServer) -> None:
    store = await opened(own_server.url, settings(on_failure="fail_closed"))
    try:
        own_server.stop()
        with pytest.raises(StoreUnavailable) as refused:
            await store.admit(caps(0.1))
        assert refused.value.status == 503 and "fail_closed" in refused.value.message
        assert not store.health.serving
    finally:
        await store.close()


def test_an_unknown_scheme_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown store URL scheme"):
        open_store(StoreSettings(), "mongodb://x", time.time)


def test_the_redis_client_is_only_imported_by_the_redis_store() -> None:
    root = Path(__file__).resolve().parents[2] / "gateway"
    importers = sorted(
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if any(line.startswith(("import redis", "from redis")) for line in path.read_text().splitlines())
    )
    assert importers == ["store/redis.py"]
    assert redis.__version__
