"""Which ledger a gateway process writes (the CLI's --ledger, env GATEWAY_LEDGER, the policy's url,
else its path) and the name it signs its rows with."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from gateway.ledger import Ledger, is_url, open_database
from gateway.policy.schema import Ledger as LedgerSettings


def ledger_target(settings: LedgerSettings, given: str | Path | None) -> str | Path:
    choice = given or os.environ.get("GATEWAY_LEDGER") or settings.url or settings.path
    return choice if is_url(choice) else Path(choice)


def open_ledger(settings: LedgerSettings, given: str | Path | None = None) -> Ledger:
    return Ledger(
        open_database(ledger_target(settings, given)),
        flush_interval_s=settings.flush_interval_s,
        batch_size=settings.batch_size,
        close_timeout_s=settings.close_timeout_s,
        spill_path=Path(settings.spill_path),
    )


def replica_name() -> str:
    """GATEWAY_REPLICA if set (a pod's name, say), else host:pid: unique among running replicas."""
    return os.environ.get("GATEWAY_REPLICA") or f"{socket.gethostname()}:{os.getpid()}"
