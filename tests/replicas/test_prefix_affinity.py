"""Cache-aware routing across gateway replicas: two ``gateway serve`` processes over one Redis (our own)
and two emulated B300 replicas of one pool. The turns of one conversation, sent to either gateway,
go to the pool replica that holds its prefix, even while that replica is the busier one (where load
alone would move them); the ledger's reported cached tokens are the emulators' own; the prediction
and its error are in the ledger and the metrics."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.emulator import create_emulator_app
from gateway.values.auth import digest_of
from tests.conftest import TIME_SCALE
from tests.servers import ThreadedServer, threaded_server

from .conftest import (
    ADMIN_KEY,
    Replica,
    auth_yaml,
    eventually,
    key_prefix,
    ledger_rows,
    redis_server,
    start_replicas,
    stop_replicas,
)

SESSION = "01a23c16-d788-7630-8d7d-566d1d111387"  # Codex sends its session as prompt_cache_key
# Two tenants beside the admin key: the route serves more than one key, so each key is its own cache
# scope (the tests above send everything with the admin key: one scope).
TENANTS = {
    "alice": "gwk-alice-0123456789abcdefghijklmnopqrstuvwxyz",
    "bob": "gwk-bob-0123456789abcdefghijklmnopqrstuvw",
}


def pool_backend(name: str, url: str) -> str:
    return f"""
  {name}:
    dialect: vllm
    url: {url}/v1
    model: moonshotai/Kimi-K3
    family: kimi-k3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, assumed_tokens_per_s: 2000}}}}
    timeouts: {{first_byte_s: 10, idle_s: 10}}"""


@dataclass
class World:
    pools: dict[str, ThreadedServer]
    replicas: list[Replica]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("affinity")
    with (
        threaded_server(create_emulator_app("b300-vllm", time_scale=TIME_SCALE)) as pool_a,
        threaded_server(create_emulator_app("b300-vllm", time_scale=TIME_SCALE)) as pool_b,
        redis_server(tmp) as redis,
    ):
        policy = tmp / "policy.yaml"
        policy.write_text(
            "backends:"
            + pool_backend("b300-a", pool_a.url)
            + pool_backend("b300-b", pool_b.url)
            + """
routes:
  agents:
    backends: [b300-a, b300-b]
    exploration: 0
  a-only:
    backends: [b300-a]
"""
            + auth_yaml(*(f"{{name: {name}, sha256: {digest_of(key)}}}" for name, key in TENANTS.items()))
            + "ledger: {flush_interval_s: 0.05}\n"
            + f"store: {{key_prefix: '{key_prefix()}', timeout_ms: 2000, sync_interval_s: 0.2}}\n"
        )
        replicas = start_replicas(policy, redis.url, tmp, 2)
        try:
            for replica in replicas:  # the start-up probes have measured both pool replicas
                eventually(lambda r=replica: r.get("/ready").status_code == 200, timeout=60)
            yield World({"b300-a": pool_a, "b300-b": pool_b}, replicas)
        finally:
            stop_replicas(replicas)


def words(seed: int, count: int) -> str:
    return " ".join(f"w{(seed * 7919 + i * 104729) % 100_003}" for i in range(count))


def send(replica: Replica, messages: list[dict[str, Any]]) -> httpx.Response:
    body = {"model": "agents", "messages": messages, "max_tokens": 4, "prompt_cache_key": SESSION}
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    response = httpx.post(replica.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response


def merged(replica: Replica) -> int:
    return int(replica.ready()["store"]["fleet"]["prefixes_merged"])


class BusyStream:
    """A long stream on b300-a through one gateway, so that b300-a is the busier pool replica."""

    def __init__(self, replica: Replica) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(replica,), daemon=True)

    def _run(self, replica: Replica) -> None:
        body = {"model": "a-only", "messages": [{"role": "user", "content": "write"}], "stream": True}
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        with httpx.stream(
            "POST", replica.url + "/v1/chat/completions", json=body, headers=headers, timeout=120
        ) as response:
            for _ in response.iter_raw():
                if self.stop.is_set():
                    return

    def __enter__(self) -> BusyStream:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)


def test_two_replicas_keep_a_conversation_on_the_pool_replica_that_holds_its_cache(world: World) -> None:
    one, two = world.replicas
    pool_a = world.pools["b300-a"]
    # b300-a's answers run long (5,000 tokens at a twentieth of its speed): the busy stream lasts.
    httpx.post(
        pool_a.url + "/emulator/faults", json={"content_tokens": 5000, "reasoning_tokens": 0, "slowdown": 20}
    )
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + words(0, 1500)},
        {"role": "user", "content": "Fix the failing test. " + words(1, 8000)},
    ]
    before = merged(two)
    first = send(one, messages)  # both replicas idle: the route's first
    holder = first.headers["x-gateway-backend"]
    assert holder == "b300-a"
    assert first.headers["x-gateway-expected-cached-tokens"] == "0"
    eventually(lambda: merged(two) > before)  # the fleet's sync carried where the prompt now lives

    state = pool_a.url + "/emulator/state"
    with BusyStream(two):
        eventually(lambda: httpx.get(state).json()["running"] >= 1)
        answers = [first]
        for turn in range(2, 6):
            reply = answers[-1].json()["choices"][0]["message"]
            messages += [
                {"role": "assistant", "content": reply.get("content") or ""},
                {"role": "user", "content": f"Turn {turn}: the tool says " + words(turn, 600)},
            ]
            replica, other = (two, one) if turn % 2 == 0 else (one, two)
            before = merged(other)
            answers.append(send(replica, messages))
            # An agent thinks between turns (here: until the fleet's sync carried this one over);
            # a turn sent sooner is predicted from the turn before, which the ledger would show.
            eventually(lambda other=other, before=before: merged(other) > before)
    # Load alone would have moved them to the idle b300-b: the cache kept them where they were.
    assert [a.headers["x-gateway-backend"] for a in answers] == [holder] * 5
    for answer in answers[1:]:
        expected = int(answer.headers["x-gateway-expected-cached-tokens"])
        assert expected > 8000
        decision = answer.headers.get_list("x-gateway-decision")
        assert decision == [f"cheapest_within_slo; expected cache hit {expected} tokens"]
        assert answer.headers["x-gateway-attempts"] == "1"

    ids = [a.headers["x-request-id"] for a in answers]

    def conversation_rows() -> list[Any]:
        rows = [
            r for replica in world.replicas for r in ledger_rows(replica.ledger) if r["request_id"] in ids
        ]
        return rows if len(rows) == len(ids) else []

    rows = sorted(eventually(conversation_rows), key=lambda r: ids.index(r["request_id"]))
    # The ledger's reported cached tokens are what the emulator served from its cache, request by request.
    served = {r["backend"]: 0 for r in rows}
    for row in rows:
        served[row["backend"]] += row["cached_prompt_tokens"]
    on_a = httpx.get(state).json()["totals"]["cached_prompt_tokens"]
    assert served == {holder: on_a} and on_a > 0
    # The prediction beside it: within a block and the message separators of what was reported.
    assert rows[0]["predicted_cached_tokens"] == 0
    for row in rows[1:]:
        predicted, reported = row["predicted_cached_tokens"], row["cached_prompt_tokens"]
        assert predicted > 0 and abs(predicted - reported) <= 0.02 * reported, (predicted, reported)
    # ... and the error in the metrics, summed by kind.
    metrics = two.get("/metrics").text
    assert 'gateway_prefix_cache_tokens_total{backend="b300-a",kind="error"}' in metrics


def test_explain_shows_each_candidates_expected_cached_tokens(world: World) -> None:
    one, two = world.replicas
    messages = [
        {"role": "system", "content": "You are a reviewer. " + words(9, 1500)},
        {"role": "user", "content": "Review this. " + words(10, 6000)},
    ]
    body = {"model": "agents", "messages": messages, "max_tokens": 4, "prompt_cache_key": "review-1"}
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    first = httpx.post(one.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert first.status_code == 200, first.text
    holder = first.headers["x-gateway-backend"]

    def explained() -> dict[str, int]:
        body = two.get("/admin/explain", model="agents", prompt_tokens=20_000, cache_key="review-1").json()
        held = {c["backend"]: c["expected_cached_tokens"] for c in body["candidates"]}
        return held if held[holder] > 0 else {}

    held = eventually(explained)
    assert {name for name, tokens in held.items() if tokens} == {holder}


def test_the_fleets_shared_index_keeps_each_keys_prompts_its_own(world: World) -> None:
    """Bob's prompt, recorded on one replica and carried to the other through Redis, is predicted
    there for bob and not for alice, who sends the same prompt and bob's conversation key."""
    one, two = world.replicas
    messages = [
        {"role": "system", "content": "Confidential memo. " + words(21, 1500)},
        {"role": "user", "content": "Summarise it. " + words(22, 1000)},
    ]

    def post(replica: Replica, tenant: str) -> httpx.Response:
        body = {"model": "agents", "messages": messages, "max_tokens": 4, "prompt_cache_key": "memo-1"}
        headers = {"authorization": f"Bearer {TENANTS[tenant]}"}
        response = httpx.post(replica.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        return response

    before = merged(two)
    post(one, "bob")
    eventually(lambda: merged(two) > before)
    assert post(two, "alice").headers["x-gateway-expected-cached-tokens"] == "0"
    assert int(post(two, "bob").headers["x-gateway-expected-cached-tokens"]) > 1024
