"""`gateway ledger migrate`: create a ledger or bring its schema to the version this gateway ships,
and say which migrations it applied."""

from __future__ import annotations

import sys

from gateway.ledger import LedgerUnavailable, open_database
from gateway.ledger.migrations import latest_version
from gateway.policy.load import PolicyError


def migrate_main(given: str | None, policy_path: str) -> int:
    from gateway.ledger.settings import resolve_ledger
    from gateway.policy.load import load_policy

    try:
        location = resolve_ledger(given, lambda: load_policy(policy_path))
        database = open_database(location.target)
        applied = database.open()
    except (LedgerUnavailable, PolicyError) as exc:
        print(f"gateway ledger migrate: {exc}", file=sys.stderr)
        return 2
    database.close()
    dialect = "postgresql" if database.shared else "sqlite"
    done = ", ".join(str(v) for v in applied) if applied else "none (already current)"
    print(f"ledger {database.location}: schema version {latest_version(dialect)}; applied {done}")
    return 0
