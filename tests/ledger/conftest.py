"""The two ledger databases the contract suite runs over: a SQLite file and a PostgreSQL database of
this run's own (``postgres_url``, from tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """Where a ledger lives: a file path or a postgresql:// URL."""
    if request.param == "sqlite":
        return tmp_path / "ledger.sqlite3"
    url: str = request.getfixturevalue("postgres_url")
    return url
