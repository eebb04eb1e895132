"""A shared ledger that goes away: rows wait (bounded) and are written when it returns, without
duplicates; a shutdown while it is away leaves them in the spool, which the next start writes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gateway.ledger import Ledger
from gateway.ledger.postgres import PostgresLedger
from tests.postgres import TcpProxy, url_of

from .test_contract import row


@pytest.fixture
def proxy() -> Iterator[TcpProxy]:
    proxy = TcpProxy()
    yield proxy
    proxy.close()


def through(proxy: TcpProxy, postgres_url: str) -> str:
    return url_of(postgres_url.rsplit("/", 1)[1], proxy.port)


def count(postgres_url: str) -> int:
    with PostgresLedger(postgres_url).reading() as reader:
        return sum(t.requests for t in reader.totals("route", 0.0))


async def wait_for(check: Callable[[], bool]) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met in time")


async def test_rows_wait_while_the_database_is_away_and_are_written_once_it_returns(
    proxy: TcpProxy, postgres_url: str
) -> None:
    ledger = Ledger(PostgresLedger(through(proxy, postgres_url), timeout_s=1.0), flush_interval_s=0.05)
    await ledger.start()
    for n in range(1, 11):
        ledger.append(row(n))
    assert await ledger.flush() and ledger.up
    proxy.cut()
    for n in range(11, 61):
        ledger.append(row(n))
    await wait_for(lambda: not ledger.up)
    assert ledger.pending == 50 and ledger.write_errors >= 1
    assert ledger.oldest_pending_since == row(11).time
    await asyncio.sleep(1.0)
    assert ledger.pending == 50, "nothing is dropped while the database is away"
    proxy.restore()
    assert await ledger.flush(timeout_s=20)
    assert ledger.up and ledger.pending == 0
    await ledger.close()
    assert count(postgres_url) == 60, "every row written once"


async def test_a_close_while_the_database_is_away_spools_and_the_next_start_writes_them(
    proxy: TcpProxy, postgres_url: str, tmp_path: Path
) -> None:
    url = through(proxy, postgres_url)
    ledger = Ledger(PostgresLedger(url, timeout_s=1.0), close_timeout_s=0.5, spool_dir=tmp_path)
    await ledger.start()
    proxy.cut()
    for n in range(1, 21):
        ledger.append(row(n))
    await ledger.close()
    assert ledger.rows_spooled == 20 and ledger.spooled == 20 and ledger.pending == 0
    proxy.restore()
    again = Ledger(PostgresLedger(url, timeout_s=1.0), spool_dir=tmp_path)
    await again.start()
    assert await again.flush(timeout_s=20)
    assert again.spooled == 0
    await again.close()
    assert count(postgres_url) == 20
