"""The ledger's writer against faults of its own machine, each made for real: the SQLite ledger locked
by another writer, its disk full (a small tmpfs, filled), the spool unwritable; and refused requests
bounded apart from billable rows, so a flood of them evicts none (issue 42)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sqlite3
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger import Ledger
from gateway.ledger.postgres import PostgresLedger
from gateway.ledger.refusal_lines import RefusalLines
from gateway.ledger.refused import RefusedRows
from gateway.ledger.rows import COLUMNS, LedgerRow
from gateway.ledger.spool import Spool, upgraded
from gateway.ledger.sqlite import SqliteLedger
from tests.postgres import TcpProxy

from .test_contract import row
from .test_outage import count, proxy, through, wait_for

__all__ = ["proxy"]  # the fixture, used here


def refused(n: int, reason: str = "invalid_api_key", key: str | None = None) -> LedgerRow:
    """A refused request's row: no route, no cost; a flood's worth all within the same few seconds."""
    return row(1)._replace(
        time=1_750_000_000.0 + n / 1000,
        request_id=f"refused-{n}",
        route="",
        status="refused",
        error_type=reason,
        api_key_name=key,
        cost_usd=0.0,
    )


def rows_in(path: Path) -> tuple[int, int]:
    """(rows, requests they count) in a SQLite ledger."""
    with sqlite3.connect(path) as conn:
        found = conn.execute("SELECT count(*), coalesce(sum(request_count), 0) FROM requests").fetchone()
    return int(found[0]), int(found[1])


async def test_a_locked_sqlite_ledger_spools_its_rows_and_writes_them_once_when_released(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path, flush_interval_s=0.05, spool_dir=tmp_path / "spool")
    await ledger.start()
    ledger.append(row(1))
    assert await ledger.flush()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another writer holds the file
    for n in range(2, 52):
        ledger.append(row(n))
    await wait_for(lambda: ledger.spooled == 50)
    assert not ledger.up and ledger.write_errors >= 1 and ledger.pending == 0
    assert "database is locked" in caplog.text
    holder.execute("ROLLBACK")
    holder.close()
    assert await ledger.flush(timeout_s=30)
    await ledger.close()
    assert ledger.up and rows_in(path) == (51, 51)


def opened_at_once(open_one: Callable[[Path], object], path: Path, openers: int = 3) -> list[BaseException]:
    """Open the new file ``path`` from ``openers`` threads released together; the errors they met. Each
    thread has its own connection, which SQLite locks against the others as it would another process's."""
    start = threading.Barrier(openers)
    errors: list[BaseException] = []

    def opener() -> None:
        start.wait()
        try:
            open_one(path)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=opener) for _ in range(openers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return errors


def test_workers_opening_a_new_sqlite_ledger_and_spool_at_once_all_open_it(tmp_path: Path) -> None:
    """``gateway serve --workers N`` starts N processes that open the same new ledger (and spool) file
    together. Switching a new file to WAL mode raced: the loser was told "database is locked" at once,
    with no busy wait, and its worker failed to start (about one try in six with three openers)."""
    for attempt in range(40):
        ledger_path = tmp_path / f"ledger-{attempt}.sqlite3"
        spool_path = tmp_path / f"spool-{attempt}.sqlite3"
        assert opened_at_once(lambda path: SqliteLedger(path).open(), ledger_path) == []
        assert opened_at_once(lambda path: Spool(path).oldest(1), spool_path) == []
        with sqlite3.connect(ledger_path) as conn:
            assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


class PausingSpool(Spool):
    """A real spool whose next ``add``, once armed, waits until the test has appended rows meanwhile."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.armed = False
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def add(self, rows: Sequence[tuple[Any, ...]]) -> None:
        if self.armed:
            self.armed = False
            self.entered.set()
            self.go_on.wait(30)
        super().add(rows)


@pytest.mark.parametrize("spool_takes_them", [True, False], ids=["spooled", "spool-locked"])
async def test_rows_on_their_way_to_the_spool_stay_counted_and_bounded_with_the_rows_appended_meanwhile(
    tmp_path: Path, spool_takes_them: bool
) -> None:
    # Before, the writer took every row out of memory and then tried the spool: while it did, the rows
    # were counted nowhere (CI saw the pending-rows gauge at 41 with 300 rows waiting), and the rows
    # appended meanwhile were bounded without them. Each cycle here starts when a batch fills (60 rows).
    path = tmp_path / "ledger.sqlite3"
    ledger = Ledger(path, flush_interval_s=3_600, batch_size=60, max_pending_rows=100)
    spool = PausingSpool(tmp_path / "spool.sqlite3")
    ledger.spool = spool
    await ledger.start()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # the database is away: rows go to the spool
    for n in range(1, 61):
        ledger.append(row(n))
    await wait_for(lambda: ledger.spooled == 60 and not ledger.up)
    spool.armed = True
    for n in range(61, 121):
        ledger.append(row(n))
    assert await asyncio.to_thread(spool.entered.wait, 30)
    assert ledger.pending == 60, "rows being moved to the spool are still counted"
    for n in range(121, 211):  # 150 rows in memory: past the bound of 100
        ledger.append(row(n))
    assert ledger.pending == 100, "one bound holds the rows on their way to the spool and the new ones"
    assert ledger.rows_dropped_billable == 0, "50 evicted on their way: dropped only if the spool fails"
    spool_holder = None
    if not spool_takes_them:  # another process holds the spool past its busy timeout: the move fails
        spool_holder = sqlite3.connect(spool.path, isolation_level=None)
        spool_holder.execute("BEGIN EXCLUSIVE")
    spool.go_on.set()
    if spool_takes_them:
        await wait_for(lambda: ledger.spooled == 210 and ledger.pending == 0)
        assert ledger.rows_dropped_billable == 0, "the rows evicted on their way were in the spool after all"
    else:
        await wait_for(lambda: ledger.spool_errors >= 1)
        assert ledger.rows_dropped_billable == 50 and ledger.pending == 100, "the newest 100 wait"
        assert spool_holder is not None
        spool_holder.execute("ROLLBACK")
        spool_holder.close()
    holder.execute("ROLLBACK")
    holder.close()
    assert await ledger.flush(timeout_s=30)
    await ledger.close()
    kept = 210 - ledger.rows_dropped_billable
    assert rows_in(path) == (kept, kept), "every row not counted dropped is written"


@contextlib.contextmanager
def small_disk(size: str = "8m") -> Iterator[Path]:
    """A tmpfs of ``size``, mounted for the test (root only) and unmounted after."""
    mount = Path(tempfile.mkdtemp(prefix="gateway-full-"))
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=False)
    if made.returncode != 0:
        mount.rmdir()
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        shutil.rmtree(mount, ignore_errors=True)


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(b"\0" * 65536)
            out.flush()
    return filler


async def test_a_sqlite_ledger_on_a_full_disk_spools_and_catches_up_once_space_is_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with small_disk() as disk:
        path = disk / "ledger.sqlite3"
        ledger = Ledger(path, flush_interval_s=0.05, batch_size=50, spool_dir=tmp_path / "spool")
        await ledger.start()
        filler = fill(disk)
        for n in range(1, 2001):  # more than the filled disk has room for
            ledger.append(row(n))
        await wait_for(lambda: not ledger.up and ledger.spooled > 0 and not ledger.pending)
        assert "full" in caplog.text
        filler.unlink()
        assert await ledger.flush(timeout_s=30)
        await ledger.close()
        assert rows_in(path) == (2000, 2000)


async def test_with_neither_database_nor_spool_rows_wait_in_memory_and_a_refusal_flood_evicts_none(
    proxy: TcpProxy, postgres_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # the spool's folder is a file: no spool can be made there
    database = PostgresLedger(through(proxy, postgres_url), timeout_s=1.0)
    ledger = Ledger(database, flush_interval_s=0.05, batch_size=20, spool_dir=blocked, max_pending_rows=100)
    await ledger.start()
    proxy.cut()
    for n in range(1, 101):
        ledger.append(row(n))
    for n in range(1, 10_001):
        ledger.append(refused(n))
    await wait_for(lambda: ledger.spool_errors >= 1 and not ledger.up)
    assert "cannot open the ledger spool" in caplog.text
    assert ledger.rows_dropped_billable == 0 and ledger.refused.dropped == 0, "no billable row evicted"
    for n in range(101, 301):  # past the billable bound (100 rows and a batch): the oldest go
        ledger.append(row(n))
    await wait_for(lambda: "billable (memory bound 100 rows), 0 refused-request rows" in caplog.text)
    proxy.restore()
    assert await ledger.flush(timeout_s=30)
    await ledger.close()
    # Read once the writer is done: a row evicted while a spool attempt was under way counts when the
    # attempt fails, and the line above may have been written before it did.
    dropped = ledger.rows_dropped_billable
    assert 300 - 100 - 20 <= dropped <= 300 - 100, "memory keeps the newest: 100 rows and a batch at most"
    with ledger.database.reading() as reader:
        totals = reader.totals("route", 0.0)
        reasons = reader.refusals(0.0)
    assert sum(t.requests - t.refused for t in totals) == 300 - dropped, "the newest billable rows"
    assert reasons == [("invalid_api_key", 10_000)], "every refusal counted"
    assert count(postgres_url) == 300 - dropped + 10_000


def test_refusals_past_their_bound_fold_into_a_row_that_counts_them() -> None:
    rows = RefusedRows(individual_per_minute=3, max_rows=1_000, max_groups=2)
    for n in range(10):
        rows.add(refused(n))  # one minute, one reason and key: 3 rows, then one counting 7
    rows.add(refused(10, key="team"))  # a group of its own
    rows.add(refused(11, reason="model_not_found"))  # a third: uncounted per minute, its own row
    taken = rows.take()
    assert [r.request_count for r in taken] == [1, 1, 1, 1, 1, 7]
    assert sum(r.request_count for r in taken) == 12 and rows.folded == 7 and rows.dropped == 0
    assert not rows.take()
    # Folded groups are bounded: with two groups folding, a third is dropped (and counted).
    tight = RefusedRows(individual_per_minute=0, max_rows=1_000, max_groups=2)
    for reason in ("a", "b", "c"):
        tight.add(refused(1, reason=reason))
    assert [r.error_type for r in tight.take()] == ["a", "b"] and tight.dropped == 1
    # Rows of their own are bounded too: past max_rows they fold.
    few = RefusedRows(individual_per_minute=100, max_rows=2)
    for n in range(5):
        few.add(refused(n))
    assert [r.request_count for r in few.take()] == [1, 1, 3]


def test_refusal_lines_are_a_few_a_minute_and_the_rest_are_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    lines = RefusalLines(per_minute=2, clock=lambda: now[0])
    log = logging.getLogger("test.refusals")
    caplog.set_level(logging.INFO, logger="test.refusals")
    allowed = [lines.allow("invalid_api_key", "-", log) for _ in range(5)]
    assert allowed == [True, True, False, False, False]
    assert lines.allow("model_not_found", "-", log), "each reason has its own allowance"
    lines.summarize(log)
    assert "more in that minute" not in caplog.text, "said once the minute is over"
    now[0] = 60.0
    lines.summarize(log)
    assert "invalid_api_key (key -): 3 more in that minute, not logged one by one" in caplog.text
    assert lines.allow("invalid_api_key", "-", log), "a new minute, a new allowance"
    assert lines.allow("invalid_api_key", "-", log) and not lines.allow("invalid_api_key", "-", log)
    lines.summarize(log, everything=True)  # at a stop
    assert "invalid_api_key (key -): 1 more in that minute" in caplog.text


def test_a_row_spooled_before_a_migration_is_written_with_the_new_columns_defaults(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool.sqlite3")
    older = (*tuple(row(1))[:-1], "key-1")  # spooled before request_count existed
    spool.add([older])
    (back,) = spool.oldest(10)
    current = upgraded(back)
    assert len(current) == len(COLUMNS) and current[-1] == "key-1"
    assert current[COLUMNS.index("request_count")] == 1
    spool.remove([current])
    assert spool.count() == 0
    spool.close()
