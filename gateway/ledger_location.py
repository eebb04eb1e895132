"""Which ledger file a command reads or writes, resolved one way for ``serve`` and ``spend``:
``--ledger``, else ``$GATEWAY_LEDGER``, else the policy's ``ledger.path``; a relative path is
relative to the working directory, as the container image and manifests expect."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # `gateway --help` imports this module: keep it light
    from gateway.policy.compiled import CompiledPolicy

LEDGER_ENV = "GATEWAY_LEDGER"


@dataclass(frozen=True, slots=True)
class LedgerLocation:
    path: Path  # absolute
    source: str  # where the path came from, in words: "--ledger", "$GATEWAY_LEDGER", "ledger.path of X"

    def __str__(self) -> str:
        return f"{self.path} (from {self.source})"


def resolve_ledger(
    flag: str | Path | None,
    policy: Callable[[], CompiledPolicy],
    environ: Mapping[str, str] | None = None,
) -> LedgerLocation:
    """``policy`` is called only when neither the flag nor the environment names the file (so
    ``gateway spend --ledger`` works where no policy file is at hand)."""
    env = os.environ if environ is None else environ
    if flag:
        return LedgerLocation(Path(flag).absolute(), "--ledger")
    if env.get(LEDGER_ENV):
        return LedgerLocation(Path(env[LEDGER_ENV]).absolute(), f"${LEDGER_ENV}")
    compiled = policy()
    return LedgerLocation(Path(compiled.ledger.path).absolute(), f"ledger.path of {compiled.source}")
