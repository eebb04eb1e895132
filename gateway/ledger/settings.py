"""Which ledger a command reads or writes, resolved one way for ``serve``, ``spend`` and ``ledger
migrate``: ``--ledger``, else env ``GATEWAY_LEDGER``, else the policy's ``ledger.url``, else its
``ledger.path`` (a relative path is relative to the working directory, as the image and manifests
expect); and the name a replica signs its rows with."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gateway.ledger import Ledger, is_url, open_database
from gateway.policy.schema import Ledger as LedgerSettings

if TYPE_CHECKING:  # `gateway --help` imports this module: keep it light
    from gateway.policy.compiled import CompiledPolicy

LEDGER_ENV = "GATEWAY_LEDGER"


@dataclass(frozen=True, slots=True)
class LedgerLocation:
    target: str | Path  # an absolute file path, or a postgresql:// URL
    source: str  # where it came from, in words: "--ledger", "$GATEWAY_LEDGER", "ledger.path of X"

    @property
    def shown(self) -> str:
        """The file's path, or the URL without its password."""
        return open_database(self.target).location if is_url(self.target) else str(self.target)

    def __str__(self) -> str:
        return f"{self.shown} (from {self.source})"


def resolve_ledger(
    flag: str | Path | None,
    policy: Callable[[], CompiledPolicy],
    environ: Mapping[str, str] | None = None,
) -> LedgerLocation:
    """``policy`` is called only when neither the flag nor the environment names the ledger (so
    ``gateway spend --ledger`` works where no policy file is at hand)."""
    env = os.environ if environ is None else environ
    if flag:
        return _located(flag, "--ledger")
    if env.get(LEDGER_ENV):
        return _located(env[LEDGER_ENV], f"${LEDGER_ENV}")
    compiled = policy()
    settings = compiled.ledger
    if settings.url:
        return _located(settings.url, f"ledger.url of {compiled.source}")
    return _located(settings.path, f"ledger.path of {compiled.source}")


def _located(choice: str | Path, source: str) -> LedgerLocation:
    return LedgerLocation(choice if is_url(choice) else Path(choice).absolute(), source)


def open_ledger(settings: LedgerSettings, target: str | Path) -> Ledger:
    return Ledger(
        open_database(target, answer_timeout_s=settings.answer_timeout_s),
        flush_interval_s=settings.flush_interval_s,
        batch_size=settings.batch_size,
        close_timeout_s=settings.close_timeout_s,
        spool_dir=Path(settings.spool_dir),
        max_pending_rows=settings.max_pending_rows,
    )


def replica_name() -> str:
    """GATEWAY_REPLICA if set (a pod's name, say), else host:pid: unique among running replicas."""
    return os.environ.get("GATEWAY_REPLICA") or f"{socket.gethostname()}:{os.getpid()}"
