"""`gateway ledger prune`: delete the request rows older than a date, keeping the spend reports
whole (their sums stay in the ledger's hourly rollup; ``gateway/ledger/prune.py``)."""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime

from gateway.ledger import LedgerUnavailable, open_database
from gateway.ledger.prune import prune
from gateway.ledger.settings import resolve_ledger
from gateway.money.spend import parse_since
from gateway.policy.load import PolicyError, load_policy


def prune_main(given: str | None, policy_path: str, before_text: str, dry_run: bool) -> int:
    try:
        location = resolve_ledger(given, lambda: load_policy(policy_path))
        before = parse_since(before_text, time.time())
        pruned = prune(open_database(location.target), before, dry_run=dry_run)
    except (ValueError, LedgerUnavailable, PolicyError) as exc:
        print(f"gateway ledger prune: {str(exc).replace('--since', '--before')}", file=sys.stderr)
        return 2
    cutoff = datetime.fromtimestamp(pruned.before, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    verb = "would delete" if dry_run else "deleted"
    print(
        f"ledger {location}: {verb} {pruned.rows:,} request rows that started before {cutoff} "
        "(their spend stays in the hourly rollup: reports over any window are unchanged)"
    )
    return 0
