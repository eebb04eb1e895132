"""The fleet's ledger: a PostgreSQL database every gateway replica writes and every report reads,
through a small psycopg connection pool. The only module that imports psycopg."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from gateway.ledger.database import LedgerRejected, LedgerUnavailable
from gateway.ledger.migrations import TRACKING_TABLE, migrations
from gateway.ledger.reader import POSTGRESQL, LedgerReader
from gateway.ledger.rows import COLUMNS, split_probes

INSERT = (
    f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join(['%s'] * len(COLUMNS))})"
    " ON CONFLICT (row_key) DO NOTHING"
)
# Synthetic probes have a table of their own: spend reports over ``requests`` never see them.
INSERT_PROBE = INSERT.replace("INSERT INTO requests", "INSERT INTO probes", 1)
# Rows per INSERT statement: one statement per batch fires the spend rollup's statement trigger once
# per batch, not once per row (PostgreSQL takes at most 65,535 parameters in one statement).
ROWS_PER_STATEMENT = 1000
# How long the database may leave a write (or the check that it is back) unanswered before it is taken
# as hung: a frozen host, a stopped server, a partition that drops packets. libpq has no read timeout,
# so without this the writer thread waits forever and every row that comes meanwhile waits in memory
# only (where a SIGKILL loses it) instead of going to the spool. Generous: 1,000 rows take well under a
# second on a busy server. The policy's ``ledger.answer_timeout_s`` sets it.
ANSWER_TIMEOUT_S = 20.0

log = logging.getLogger("gateway.ledger")
# The pool logs each failed connection attempt as a warning (one every second or two while the database
# is away); the writer says the outage once and counts failed writes, so the pool's own are quieted.
logging.getLogger("psycopg.pool").setLevel(logging.ERROR)


def insert_many(cursor: psycopg.Cursor[Any], insert: str, rows: Sequence[tuple[Any, ...]]) -> None:
    """``insert`` (one row's VALUES) for every row, as few multi-row statements."""
    head, _, tail = insert.partition(" VALUES ")
    one, _, conflict = tail.partition(")")
    for start in range(0, len(rows), ROWS_PER_STATEMENT):
        chunk = rows[start : start + ROWS_PER_STATEMENT]
        values = ", ".join([one + ")"] * len(chunk))
        params = [value for row in chunk for value in row]
        cursor.execute(f"{head} VALUES {values}{conflict}".encode(), params)


MIGRATION_LOCK = 0x6C6564676572  # "ledger": one migrator at a time across the fleet
# How long a write waits for a pooled connection. The pool connects in the background, so a slow
# connect is not cut short by this: the write fails, its rows go to the spool, and the next write
# finds the connection made. Short, because while the server refuses connections every write waits
# this long, and the rows that arrive meanwhile are in memory only (what a SIGKILL would lose).
CONNECTION_WAIT_S = 1.0


@contextlib.contextmanager
def answered_within(conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Cut ``conn`` if what runs inside takes longer than ``seconds``: its socket is shut down (from a
    timer thread, the fd itself left to psycopg), so the read libpq blocks in returns and psycopg
    raises; the pool then drops the broken connection."""
    timer = threading.Timer(seconds, _cut, (conn, seconds))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _cut(conn: psycopg.Connection[Any], seconds: float) -> None:
    with contextlib.suppress(OSError, psycopg.Error):
        with socket.socket(fileno=os.dup(conn.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        log.warning("ledger: the database left a statement unanswered for %gs: connection cut", seconds)


def redact(url: str) -> str:
    """The URL without its password, fit for logs and reports."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username}:***@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def migrate(conn: psycopg.Connection[Any]) -> list[int]:
    """Apply the missing migrations in one transaction, holding a lock so that replicas starting
    together take turns; return the versions applied."""
    applied = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        conn.execute(TRACKING_TABLE)
        done = {row[0] for row in conn.execute("SELECT version FROM schema_migrations").fetchall()}
        for migration in migrations("postgresql"):
            if migration.version in done:
                continue
            for statement in migration.statements:
                conn.execute(statement.encode())
            record = "INSERT INTO schema_migrations VALUES (%s, %s, %s)"
            conn.execute(record, (migration.version, migration.name, time.time()))
            applied.append(migration.version)
    return applied


class PostgresLedger:
    """A pool of at most ``max_connections`` (the writer thread takes one at a time; reports one
    more). ``timeout_s`` bounds a connection attempt (and opening); a write waits for a connection at
    most ``CONNECTION_WAIT_S`` of it."""

    shared = True

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        max_connections: int = 3,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
    ) -> None:
        self.url = url
        self._timeout_s = timeout_s
        self._connect_timeout_s = max(1, int(timeout_s))  # libpq's connect_timeout takes whole seconds
        self._answer_timeout_s = answer_timeout_s
        self._max_connections = max_connections
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._away = False  # the last write failed

    @property
    def location(self) -> str:
        return redact(self.url)

    def open(self) -> list[int]:
        kwargs = {"connect_timeout": self._connect_timeout_s, "application_name": "gateway-ledger"}
        try:
            # Knocked first, as opening the pool would wait out its timeout (and the writer opens again
            # while the database is away: ``Ledger._opened_now``).
            self._knock()
        except psycopg.Error as exc:
            raise LedgerUnavailable(f"cannot open the ledger at {self.location}: {exc}") from exc
        pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self.url,
            min_size=1,
            max_size=self._max_connections,
            kwargs=kwargs,
            open=False,
            timeout=min(self._timeout_s, CONNECTION_WAIT_S),
            # No check on checkout: it is a round trip a hung server never answers, outside the deadline
            # of ``answered_within``. A connection an outage broke fails its first write instead; the
            # rows go to the spool and the pool drops the connection.
            name="gateway-ledger",
        )
        try:
            pool.open(wait=True, timeout=self._timeout_s)
            with pool.connection() as conn:
                applied = migrate(conn)
        except (psycopg.Error, PoolTimeout) as exc:
            pool.close()
            raise LedgerUnavailable(f"cannot open the ledger at {self.location}: {exc}") from exc
        self._pool = pool
        return applied

    def _knock(self) -> None:
        """A connection made and closed at once: a server that refuses says so at once, where waiting
        on the pool would hold the rows that arrive meanwhile in memory only."""
        psycopg.connect(self.url, connect_timeout=self._connect_timeout_s).close()

    def write(self, rows: Sequence[tuple[Any, ...]]) -> None:
        pool = self._pool
        if pool is None:
            raise LedgerUnavailable("the ledger is not open")
        try:
            if self._away:
                self._knock()  # the pool would wait CONNECTION_WAIT_S for a connection
            # The commit is inside the deadline too (the transaction's own block, not the pool's exit).
            with (
                pool.connection() as conn,
                answered_within(conn, self._answer_timeout_s),
                conn.transaction(),
                conn.cursor() as cursor,
            ):
                requests, probes = split_probes(rows)
                insert_many(cursor, INSERT, requests)
                insert_many(cursor, INSERT_PROBE, probes)
        except (psycopg.DataError, psycopg.IntegrityError) as exc:
            raise LedgerRejected(f"the ledger at {self.location} refused rows: {exc}") from exc
        except (psycopg.Error, PoolTimeout) as exc:
            self._away = True
            raise LedgerUnavailable(f"ledger write to {self.location} failed: {exc}") from exc
        self._away = False

    @contextlib.contextmanager
    def reading(self) -> Iterator[LedgerReader]:
        try:
            with contextlib.ExitStack() as stack:
                if self._pool is not None:  # the writer's: bounded as its writes are
                    conn = stack.enter_context(self._pool.connection())
                    stack.enter_context(answered_within(conn, self._answer_timeout_s))
                    stack.enter_context(conn.transaction())  # its end, the last round trip, bounded too
                else:  # a report: one connection, no pool, no migrations
                    conn = stack.enter_context(psycopg.connect(self.url, connect_timeout=10))
                yield LedgerReader(conn, POSTGRESQL, self.location)
        except (psycopg.Error, PoolTimeout) as exc:
            raise LedgerUnavailable(f"reading the ledger at {self.location} failed: {exc}") from exc

    @contextlib.contextmanager
    def maintaining(self) -> Iterator[LedgerReader]:
        try:
            with psycopg.connect(self.url, connect_timeout=10) as conn, conn.transaction():
                yield LedgerReader(conn, POSTGRESQL, self.location)
        except (psycopg.Error, PoolTimeout) as exc:
            raise LedgerUnavailable(f"maintaining the ledger at {self.location} failed: {exc}") from exc

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
