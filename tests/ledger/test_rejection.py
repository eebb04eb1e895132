"""Rows a database will not hold as they are never stop the ledger (``gateway/ledger/rejection.py``),
on both databases: a NUL byte in text, counts past BIGINT or big enough that the spend rollup's sums
overflow (the hour's later rows failed with them, retried forever), a non-finite cost; and a row the
database refuses even scrubbed is left out alone, every other row of its batch written."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.ledger import Ledger, open_database
from gateway.ledger.database import LedgerRejected
from gateway.ledger.rejection import INT_LIMIT, scrubbed, write_apart
from tests.ledger.test_contract import row


def write_all(target: str | Path, rows: list[object]) -> Ledger:
    ledger = Ledger(open_database(target), flush_interval_s=0.02, batch_size=100)

    async def run() -> None:
        await ledger.start()
        try:
            for one in rows:
                ledger.append(one)  # type: ignore[arg-type]
            assert await ledger.flush(timeout_s=30), "the ledger never wrote its rows"
        finally:
            await ledger.close()

    asyncio.run(run())
    return ledger


def totals(target: str | Path) -> tuple[int, int, float]:
    database = open_database(target)
    with database.reading() as reader:
        found = reader.query("SELECT count(*), sum(completion_tokens), sum(cost_usd) FROM requests")
    database.close()
    count, tokens, cost = found[0]
    return int(count), int(tokens), float(cost)


def test_rows_no_column_takes_are_scrubbed_and_the_rest_are_written(target: str | Path) -> None:
    lies = [
        row(1, upstream_model="kimi\x00k3", decision_reason="\x00"),
        row(2, completion_tokens=2**62),  # fits BIGINT: the rollup's sum with the next does not
        row(3, completion_tokens=2**62),
        row(4, completion_tokens=2**70, prompt_tokens=-(2**70)),  # past BIGINT: no driver binds it
        row(5, cost_usd=math.nan, ttft_s=math.inf),
    ]
    honest = [row(n) for n in range(6, 26)]
    ledger = write_all(target, [*lies[:3], *honest, *lies[3:]])
    assert ledger.rows_written == 25 and ledger.rows_scrubbed == 5 and ledger.rows_rejected == 0
    count, tokens, cost = totals(target)
    assert count == 25
    assert tokens == 3 * INT_LIMIT + 101 + 105 + sum(100 + n for n in range(6, 26))
    assert math.isfinite(cost)
    assert ledger.up and ledger.pending == 0


def test_a_row_refused_even_scrubbed_is_left_out_alone(target: str | Path) -> None:
    # route is NOT NULL: no scrubbing makes None fit, so the database refuses the row itself.
    rows = [row(n) for n in range(1, 41)]
    rows[17] = rows[17]._replace(route=None)  # type: ignore[arg-type]
    ledger = write_all(target, rows)
    assert ledger.rows_rejected == 1 and ledger.rows_written == 39
    assert totals(target)[0] == 39
    assert ledger.up, "a refused row is not an outage"


def test_write_apart_isolates_refused_rows_in_few_writes() -> None:
    calls: list[int] = []

    def write(batch: Sequence[tuple[Any, ...]]) -> None:
        calls.append(len(batch))
        if bad in batch:
            raise LedgerRejected("no")

    # Rows are tuples, as the writer's are (a compiled rejection.py checks that they are).
    good, bad = ("ok",), ("bad",)
    batch = [good] * 64
    batch[5] = batch[40] = bad
    assert write_apart(write, batch) == [bad, bad]
    assert len(calls) < 30, "halving: about 2 log2(n) writes per refused row, not one per row"
    assert write_apart(write, [good] * 10) == [] and calls[-1] == 10


def test_a_safe_row_is_not_copied() -> None:
    assert scrubbed(tuple(row(1))) is None


@pytest.mark.parametrize("value", [INT_LIMIT, -INT_LIMIT, 0])
def test_counts_within_the_limit_are_kept(value: int) -> None:
    assert scrubbed(tuple(row(1, completion_tokens=value))) is None
