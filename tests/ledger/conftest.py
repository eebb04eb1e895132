"""The two ledger databases the contract suite runs over: a SQLite file and a PostgreSQL database of
this run's own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres import scratch_database, url_of


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    with scratch_database() as name:
        yield name


@pytest.fixture
def postgres_url(postgres_database: str) -> Iterator[str]:
    """The run's database, emptied for each test."""
    import psycopg

    url = url_of(postgres_database)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS requests, schema_migrations")
    yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """Where a ledger lives: a file path or a postgresql:// URL."""
    if request.param == "sqlite":
        return tmp_path / "ledger.sqlite3"
    url: str = request.getfixturevalue("postgres_url")
    return url
