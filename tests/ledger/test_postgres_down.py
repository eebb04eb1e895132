"""The ledger's PostgreSQL stopped and started again while a real gateway process answers requests
(issue 38), each fault made for real on a server of the test's own (``tests/private_postgres.py``):

- stopped (fast) under load and started again: every answered request has exactly one row, and the
  spool's rows written a second time (a retried batch) change nothing;
- a flood of refused requests while it is stopped and the spool cannot be written either (issue 42):
  every billable row is still there after, the refusals are counted in a few rows and log lines;
- the gateway SIGKILLed while it is stopped (immediate), then started again on the same spool: the
  rows spooled before the kill are written once, and what was lost is at most what memory held;
- hung under load (every process of it SIGSTOPped, as a frozen host: connections stay open and nothing
  answers): writes are cut after ``answer_timeout_s``, rows go to the spool, and each is written once
  when it answers again.

Each test prints its figures (rows answered, spooled, lost, duplicated) for docs/reliability.md.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sqlite3
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson
import psycopg
import pytest

from gateway.ledger import Ledger
from gateway.ledger.postgres import PostgresLedger
from gateway.ledger.spool import spool_file
from tests.conftest import PAID_KEY, Upstreams, policy_yaml
from tests.private_postgres import PrivatePostgres, private_postgres
from tests.replicas.conftest import ADMIN_KEY, HELLO, Replica, auth_yaml, eventually
from tests.replicas.test_shared_ledger import ROUTES, Load, metrics, roomy
from tests.servers import ProcessServer, free_port, python_module, wait_http


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    with private_postgres() as server:
        yield server


@dataclass
class Setup:
    url: str  # the ledger: a database of this test's own on the private server
    policy: Path
    spool: Path
    tmp: Path


@pytest.fixture
def setup(server: PrivatePostgres, upstreams: Upstreams, tmp_path: Path) -> Iterator[Setup]:
    if not server.running:
        server.start()
    name = f"ledger_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    upstreams.reset()
    spool = tmp_path / "spool"
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        roomy(policy_yaml(upstreams, ROUTES))
        + auth_yaml()
        + f"ledger: {{flush_interval_s: 0.05, close_timeout_s: 5, spool_dir: '{spool}'}}\n"
    )
    yield Setup(server.url.rsplit("/", 1)[0] + f"/{name}", policy, spool, tmp_path)
    upstreams.reset()


def serve(setup: Setup, name: str, log_level: str = "warning") -> Replica:
    port, log = free_port(), setup.tmp / f"{name}.log"
    args = ["gateway", "--log-level", log_level, "serve", "--policy", str(setup.policy)]
    args += ["--port", str(port), "--ledger", setup.url]
    env = {"TEST_PAID_API_KEY": PAID_KEY, "GATEWAY_REDIS_URL": ""}
    process = ProcessServer(python_module(*args), env=env, log_path=str(log)).start()
    replica = Replica(process, port, setup.tmp / "unused.sqlite3", log)
    wait_http(replica.url + "/health", timeout=60)
    return replica


def rows_per_request(url: str) -> Counter[str]:
    with psycopg.connect(url) as conn:
        found = conn.execute("SELECT request_id, count(*) FROM requests GROUP BY 1").fetchall()
    return Counter({request_id: int(n) for request_id, n in found})


def spooled_request_ids(path: Path) -> list[str]:
    """The request ids in a spool file, read as the next start will (a row's id is its 2nd column)."""
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as conn:
        return [orjson.loads(blob)[1] for (blob,) in conn.execute("SELECT row FROM spooled")]


def copy_of(path: Path, to: Path) -> None:
    """A consistent copy of a spool a live process writes (SQLite's online backup)."""
    to.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as source, sqlite3.connect(to) as target:
        source.backup(target)


def under_load(replica: Replica, workers: int = 6) -> tuple[Load, threading.Thread]:
    load = Load([replica], workers=workers)
    thread = threading.Thread(target=load.run)
    thread.start()
    return load, thread


def each_answered_row_once(gateway: Replica, setup: Setup, load: Load) -> Counter[str]:
    """Once the spool is empty: a row for each request ``load`` had answered, and no other, none twice."""
    eventually(lambda: metrics(gateway)["gateway_ledger_spool_rows{}"] == 0, timeout=60)
    eventually(lambda: set(load.completed) <= set(rows_per_request(setup.url)), timeout=60)
    written = rows_per_request(setup.url)
    assert set(written) == set(load.completed), "a row for each answered request, and no other"
    assert max(written.values()) == 1, "no row written twice"
    return written


def test_postgres_stopped_and_started_under_load_writes_every_answered_row_once(
    server: PrivatePostgres, setup: Setup
) -> None:
    gateway = serve(setup, "gateway")
    load, thread = under_load(gateway)
    try:
        eventually(lambda: len(load.completed) >= 30, timeout=60)
        server.stop("fast")
        answered_at_stop = len(load.completed)
        eventually(lambda: metrics(gateway)["gateway_ledger_rows_spooled_total{}"] >= 50, timeout=60)
        eventually(lambda: len(load.completed) >= answered_at_stop + 50, timeout=60)
        spool = spool_file(setup.spool, PostgresLedger(setup.url).location)
        copy_of(spool, setup.tmp / "again" / spool.name)  # spooled rows, to write a second time
        during = metrics(gateway)
        server.start()
        eventually(lambda: metrics(gateway)["gateway_ledger_up{}"] == 1, timeout=60)
        answered_at_start = len(load.completed)
        eventually(lambda: len(load.completed) >= answered_at_start + 30, timeout=60)
    finally:
        load.stop.set()
        thread.join(timeout=60)
    assert not load.failed, f"{len(load.failed)} requests failed: the database's outage reached clients"
    written = each_answered_row_once(gateway, setup, load)
    after = metrics(gateway)
    assert after["gateway_ledger_write_errors_total{}"] >= 1 and during["gateway_ledger_up{}"] == 0

    # A retried batch: the spool as it was during the outage, written again by another writer.
    again = Ledger(PostgresLedger(setup.url), spool_dir=setup.tmp / "again", flush_interval_s=0.05)
    replayed = len(spooled_request_ids(setup.tmp / "again" / spool.name))
    asyncio.run(replay(again))
    assert again.rows_written == replayed > 0 and again.spooled == 0
    assert rows_per_request(setup.url) == written, "rows written twice are counted once"
    gateway.process.stop()
    print(
        f"\nPostgreSQL stopped (fast) and started under load: answered {len(load.completed)}"
        f" ({len(load.completed) - answered_at_stop} after the stop), rows {sum(written.values())},"
        f" spooled {int(after['gateway_ledger_rows_spooled_total{}'])}, lost"
        f" {len(set(load.completed) - set(written))}, duplicated {sum(n - 1 for n in written.values())};"
        f" the spool written a second time: {replayed} rows, 0 added"
    )


def test_postgres_hung_under_load_sends_rows_to_the_spool_and_writes_each_once(
    server: PrivatePostgres, setup: Setup
) -> None:
    # Without a deadline the writer waits forever on a read libpq never ends: no row reaches the spool.
    text = setup.policy.read_text().replace("close_timeout_s: 5,", "close_timeout_s: 5, answer_timeout_s: 1,")
    setup.policy.write_text(text)
    gateway = serve(setup, "gateway")
    load, thread = under_load(gateway)
    frozen: list[int] = []
    try:
        eventually(lambda: len(load.completed) >= 30, timeout=60)
        frozen = server.processes()
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        answered_at_freeze = len(load.completed)
        eventually(lambda: metrics(gateway)["gateway_ledger_rows_spooled_total{}"] >= 50, timeout=60)
        eventually(lambda: len(load.completed) >= answered_at_freeze + 50, timeout=60)
        during = metrics(gateway)
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        frozen = []
        eventually(lambda: metrics(gateway)["gateway_ledger_up{}"] == 1, timeout=60)
        answered_at_thaw = len(load.completed)
        eventually(lambda: len(load.completed) >= answered_at_thaw + 30, timeout=60)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
        load.stop.set()
        thread.join(timeout=60)
    assert not load.failed, f"{len(load.failed)} requests failed: the hung database reached clients"
    written = each_answered_row_once(gateway, setup, load)
    gateway.process.stop()
    assert during["gateway_ledger_up{}"] == 0
    print(
        f"\nPostgreSQL hung (SIGSTOP) under load: answered {len(load.completed)}"
        f" ({answered_at_thaw - answered_at_freeze} while hung), spooled while hung"
        f" {int(during['gateway_ledger_rows_spooled_total{}'])},"
        f" lost {len(set(load.completed) - set(written))},"
        f" duplicated {sum(n - 1 for n in written.values())}"
    )


async def replay(ledger: Ledger) -> None:
    await ledger.start()
    try:
        assert await ledger.flush(timeout_s=60)
    finally:
        await ledger.close()


def test_a_refusal_flood_while_the_database_is_stopped_evicts_no_billable_row(
    server: PrivatePostgres, setup: Setup
) -> None:
    # The worst case: the spool cannot be written either (its folder is a file), so every row waits in
    # memory, billable rows up to 500. Before, 3,000 refusals would have pushed them all out.
    setup.spool.write_text("not a folder")
    text = setup.policy.read_text().replace(
        "close_timeout_s: 5,", "close_timeout_s: 5, max_pending_rows: 500,"
    )
    setup.policy.write_text(text)
    gateway = serve(setup, "gateway", log_level="info")
    server.stop("fast")
    before = asyncio.run(send(gateway.url, 200, billable=True))
    refused = asyncio.run(send(gateway.url, 3_000, billable=False))
    after = asyncio.run(send(gateway.url, 100, billable=True))
    assert [status for status, _ in refused] == [401] * 3_000
    billable = [request_id for status, request_id in (*before, *after) if status == 200]
    assert len(billable) == 300, "every billable request answered while the database is away"
    during = metrics(gateway)
    assert during["gateway_ledger_up{}"] == 0 and during["gateway_ledger_spool_errors_total{}"] >= 1
    assert during["gateway_ledger_pending_rows{}"] >= 300
    server.start()
    eventually(lambda: set(billable) <= set(rows_per_request(setup.url)), timeout=60)
    eventually(lambda: metrics(gateway)["gateway_ledger_pending_rows{}"] == 0, timeout=60)
    seen = metrics(gateway)
    gateway.process.stop()  # the log lines the flood did not get are summed up by the stop at last
    written = rows_per_request(setup.url)
    assert max(written.values()) == 1
    assert seen["gateway_ledger_rows_dropped_total{kind=billable}"] == 0
    with psycopg.connect(setup.url) as conn:
        found = conn.execute(
            "SELECT count(*), sum(request_count) FROM requests WHERE error_type = 'invalid_api_key'"
        ).fetchone()
    assert found is not None
    rows, counted = found
    assert counted == 3_000 and seen["gateway_ledger_rows_dropped_total{kind=refused}"] == 0
    assert rows < 100, "the flood is folded into a few rows"
    log = gateway.log.read_text()
    lines = log.count("refused request ")
    assert lines <= 3 * 10, f"{lines} log lines for 3,000 refusals"
    assert "not logged one by one" in log, "the lines left out are counted in one"
    print(
        f"\nrefusal flood while PostgreSQL is stopped and the spool unwritable: billable answered"
        f" {len(billable)}, their rows {len(set(billable) & written.keys())}; 3,000 refusals in {rows}"
        f" rows and {lines} log lines; dropped: billable 0, refused 0"
    )


async def send(url: str, count: int, *, billable: bool) -> list[tuple[int, str]]:
    """``count`` requests, 20 at a time: billable ones with the admin key and their own request id,
    or keyless ones (each refused: 401); (status, request id) of each."""
    body = {"model": "paid-only", "messages": HELLO, "max_tokens": 20}
    kind = "billable" if billable else "keyless"
    answers: list[tuple[int, str]] = []
    async with httpx.AsyncClient(timeout=60) as client:
        for start in range(0, count, 20):
            ids = [f"{kind}-{uuid.uuid4().hex[:8]}-{n}" for n in range(start, min(count, start + 20))]
            auth = {"authorization": f"Bearer {ADMIN_KEY}"} if billable else {}
            posts = (
                client.post(url + "/v1/chat/completions", json=body, headers={"x-request-id": i, **auth})
                for i in ids
            )
            responses = await asyncio.gather(*posts)
            answers += [(r.status_code, i) for r, i in zip(responses, ids, strict=True)]
    return answers


def test_a_gateway_sigkilled_while_the_database_is_stopped_writes_its_spooled_rows_once(
    server: PrivatePostgres, setup: Setup
) -> None:
    first = serve(setup, "first")
    load, thread = under_load(first)
    try:
        eventually(lambda: len(load.completed) >= 30, timeout=60)
        server.stop("immediate")
        answered_at_stop = len(load.completed)
        eventually(lambda: metrics(first)["gateway_ledger_rows_spooled_total{}"] >= 50, timeout=60)
        eventually(lambda: len(load.completed) >= answered_at_stop + 50, timeout=60)
        # What memory holds just before the kill: the most a SIGKILL may lose, with what is answered
        # between this read and the kill. The answers are counted first: a row goes into memory before
        # its answer's last byte (a stream's just after it, with nothing awaited between), so a request
        # answered by then has its row in the scrape. Counted after the scrape, an answer that came
        # between the two had its row in neither (stop 49's CI: 7 lost against a bound of 6).
        answered_at_read = len(load.completed)
        last = metrics(first)
        assert first.process.proc is not None
        os.kill(first.process.proc.pid, signal.SIGKILL)
        first.process.proc.wait(timeout=30)
    finally:
        load.stop.set()
        thread.join(timeout=60)
    answered = set(load.completed)  # every one of them before the kill
    spool = spool_file(setup.spool, PostgresLedger(setup.url).location)
    spooled = spooled_request_ids(spool)
    assert len(spooled) >= 50
    server.start()
    second = serve(setup, "second")
    try:
        eventually(lambda: set(spooled) <= set(rows_per_request(setup.url)), timeout=60)
        eventually(lambda: metrics(second)["gateway_ledger_spool_rows{}"] == 0, timeout=60)
    finally:
        second.process.stop()
    written = rows_per_request(setup.url)
    assert all(written[request_id] == 1 for request_id in spooled), "each spooled row written once"
    assert max(written.values()) == 1, "no row written twice"
    lost = answered - set(written)
    bound = last["gateway_ledger_pending_rows{}"] + (len(answered) - answered_at_read)
    assert len(lost) <= bound, f"{len(lost)} answered rows lost; memory held {bound} at the kill"
    print(
        f"\ngateway SIGKILLed while PostgreSQL is stopped (immediate): answered {len(answered)}"
        f" ({len(answered) - answered_at_stop} in the outage), spooled {len(spooled)}, written after the"
        f" restart {len(set(spooled))} once each, lost {len(lost)} (bound: memory held {int(bound)}),"
        f" duplicated {sum(n - 1 for n in written.values())}"
    )
    shutil.rmtree(setup.spool, ignore_errors=True)


def test_a_gateway_started_while_the_database_is_stopped_serves_and_writes_its_rows_once_it_is_back(
    server: PrivatePostgres, setup: Setup
) -> None:
    # A fleet whose database and replicas restart together: before, the start failed ("cannot open the
    # ledger") and the replica stayed down as long as the database.
    server.stop("fast")
    gateway = serve(setup, "gateway")
    answers = asyncio.run(send(gateway.url, 60, billable=True))
    billable = [request_id for status, request_id in answers if status == 200]
    assert len(billable) == 60, "every request answered while the database never was reachable"
    eventually(lambda: metrics(gateway)["gateway_ledger_rows_spooled_total{}"] >= 60, timeout=60)
    during = metrics(gateway)
    assert during["gateway_ledger_up{}"] == 0
    server.start()

    def written_ids() -> set[str]:  # no table until the gateway, seeing the database back, migrates it
        try:
            return set(rows_per_request(setup.url))
        except psycopg.errors.UndefinedTable:
            return set()

    eventually(lambda: set(billable) <= written_ids(), timeout=60)
    eventually(lambda: metrics(gateway)["gateway_ledger_spool_rows{}"] == 0, timeout=60)
    assert metrics(gateway)["gateway_ledger_up{}"] == 1
    gateway.process.stop()
    written = rows_per_request(setup.url)
    assert set(written) == set(billable) and max(written.values()) == 1
    assert "serving without it" in gateway.log.read_text()
    print(
        f"\nstarted while PostgreSQL was stopped: answered {len(billable)}, spooled"
        f" {int(during['gateway_ledger_rows_spooled_total{}'])}, written once each when it came back"
    )
