"""The ledger's schema, versioned: numbered SQL files under ``migrations/<dialect>/``, applied in order
at start-up (and by ``gateway ledger migrate``), each recorded in ``schema_migrations``."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
TRACKING_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations"
    " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def migrations(dialect: str) -> list[Migration]:
    """Every migration of ``dialect`` ("sqlite" or "postgresql"), oldest first."""
    found = []
    for path in sorted((MIGRATIONS_DIR / dialect).glob("*.sql")):
        match = re.fullmatch(r"(\d{4})_(\w+)\.sql", path.name)
        if match is None:
            raise ValueError(f"{path}: migrations are named NNNN_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), statements(path.read_text())))
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise ValueError(f"{MIGRATIONS_DIR / dialect}: versions must run 1, 2, 3... (found {versions})")
    return found


def statements(script: str) -> tuple[str, ...]:
    """The statements of a migration file: comments dropped, split at semicolons (none in strings),
    except those inside a PostgreSQL function body (between ``$$``) or a SQLite trigger's
    ``BEGIN ... END``, which end statements of the body, not of the file."""
    text = "\n".join(line.split("--", 1)[0] for line in script.splitlines())
    found: list[str] = []
    current = ""
    for piece in text.split(";"):
        current += piece
        if current.count("$$") % 2 or _open_trigger(current):
            current += ";"
            continue
        if current.strip():
            found.append(current.strip())
        current = ""
    if current.strip():
        found.append(current.strip())
    return tuple(found)


def _open_trigger(statement: str) -> bool:
    """A SQLite ``CREATE TRIGGER ... BEGIN`` whose ``END`` has not come yet."""
    if not re.match(r"\s*CREATE\s+TRIGGER\b", statement, re.IGNORECASE):
        return False
    return bool(re.search(r"\bBEGIN\b", statement, re.IGNORECASE)) and not re.search(
        r"\bEND\s*$", statement, re.IGNORECASE
    )


def latest_version(dialect: str) -> int:
    return len(migrations(dialect))
