"""The fleet sync in virtual time: two replicas' LiveStats joined by a message board instead of Redis.
What one replica measures shows in the other's views; in-flight counts add up and fade when a replica
falls silent; a circuit one replica opens is open on the other, and is not echoed back."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gateway.measure.fleet import Fleet
from gateway.measure.stats import LiveStats
from gateway.store import Message
from gateway.store.memory import MemoryStore
from tests.unit.factories import FakeClock, api_backend, attempt, policy, pool_backend, route, serve

POLICY = policy([pool_backend("b300"), api_backend("api")], [route(("b300", "api"))])
INTERVAL_S = 0.5


@dataclass
class Board:
    """Every replica's posts, in order; each reader has its own place in it."""

    posts: list[tuple[str, bytes]] = field(default_factory=list)


class BoardStore(MemoryStore):
    shared = True

    def __init__(self, board: Board, replica: str) -> None:
        super().__init__()
        self._board, self._replica, self._read = board, replica, 0

    async def exchange(self, outgoing: bytes | None) -> list[Message]:
        if outgoing is not None:
            self._board.posts.append((self._replica, outgoing))
        new, self._read = self._board.posts[self._read :], len(self._board.posts)
        return [Message(replica, payload, 0.0) for replica, payload in new if replica != self._replica]


@dataclass
class Replica:
    clock: FakeClock
    stats: LiveStats
    fleet: Fleet


def replicas(count: int = 2) -> list[Replica]:
    board, clock = Board(), FakeClock()
    made = []
    for i in range(count):
        stats = LiveStats(clock)
        fleet = Fleet(stats, BoardStore(board, f"r{i}"), lambda: POLICY, clock, INTERVAL_S)
        made.append(Replica(clock, stats, fleet))
    return made


async def sync(*members: Replica) -> None:
    for member in members:
        await member.fleet.sync_once()


async def test_what_one_replica_measures_the_other_decides_on() -> None:
    one, two = replicas()
    for _ in range(5):
        done = serve(one.stats, one.clock, "b300", ttft_s=2.5, tokens_per_s=40.0, completion_tokens=401)
        one.fleet.attempt_finished(done, "kimi-k3")
    await sync(one, two)
    seen, measured = two.stats.view("b300"), one.stats.view("b300")
    assert seen.samples == 5 and seen.ttft_p95_s == pytest.approx(2.5)
    assert seen.decode_tokens_per_s == pytest.approx(measured.decode_tokens_per_s)
    assert seen.learned_completion_tokens("kimi-k3") == pytest.approx(401)
    assert two.fleet.report() == {"replicas_heard": ["r0"], "attempts_merged": 5, "prefixes_merged": 0}
    await sync(one, two)
    assert two.stats.view("b300").samples == 5, "each attempt is merged once"


async def test_in_flight_counts_add_up_and_fade_with_a_silent_replica() -> None:
    one, two = replicas()
    for _ in range(3):
        one.stats.attempt_started("api")
    two.stats.attempt_started("api")
    await sync(one, two, one, two)
    assert one.stats.view("api").inflight == 4 and two.stats.view("api").inflight == 4
    assert two.stats.local_inflight("api") == 1
    one.clock.advance(10 * INTERVAL_S)  # r0 falls silent (both share the clock: r1 keeps syncing)
    await sync(two)
    assert two.stats.view("api").inflight == 1


async def test_a_circuit_opened_by_one_replica_is_open_on_the_other_and_not_echoed() -> None:
    one, two = replicas()
    for _ in range(5):
        serve(one.stats, one.clock, "api", status="upstream_error", http_status=503)
    assert one.stats.view("api").circuit == "open"
    await sync(one, two)
    assert two.stats.view("api").circuit == "open" and not two.stats.view("api").accepts_requests
    assert two.stats.circuit("api").opened_count == 0, "adopted, not counted as its own opening"
    await sync(two, one)
    assert one.stats.circuit("api").opened_count == 1, "nothing came back to re-open it"
    one.clock.advance(2.0)  # past the cooldown: one probe, which succeeds and closes it
    serve(one.stats, one.clock, "api")
    assert one.stats.view("api").circuit == "closed"
    await sync(one, two)
    assert two.stats.view("api").circuit == "closed"


async def test_a_replica_that_joins_starts_from_what_the_fleet_has_probed() -> None:
    board, clock = Board(), FakeClock()
    stats = LiveStats(clock)
    one = Fleet(stats, BoardStore(board, "one"), lambda: POLICY, clock, INTERVAL_S)
    ticket = stats.attempt_started("api", probe=True)
    probe = attempt("api", clock.now, ttft_s=0.5, completion_tokens=1)
    probe.probe = True
    clock.now = probe.finished_at or clock.now
    stats.probe_finished(ticket, probe, recovery_probes=2, ratio=0.5)
    one.attempt_finished(probe, "")
    await one.sync_once()
    # A new replica reads the board from its start, as a new Redis reader reads the last minute.
    joined = LiveStats(clock)
    fleet = Fleet(joined, BoardStore(board, "new"), lambda: POLICY, clock, INTERVAL_S)
    assert not fleet.synced
    await fleet.sync_once()
    view = joined.view("api")
    assert fleet.synced and view.samples == 1 and view.ttft_p95_s == pytest.approx(0.5) and view.probes == 1
    assert view.last_user_sample_at is None, "a probe, not a user's request"
