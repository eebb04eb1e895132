"""The engine contracts (docs/contracts/*.yaml) as data the suite runs: entries, checks, citations."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts"
SECTIONS = (
    "health",
    "metrics",
    "usage",
    "reasoning",
    "limits",
    "models",
    "errors_in_stream",
    "continuation",
    "prefix_cache",
    "tracing",
)
# path:line or path:first-last, under the engine's own package tree (vllm/, sglang/, llama.cpp/).
CITATION = re.compile(r"^(vllm|sglang|llama\.cpp)/[\w./-]+\.(py|cpp|h):\d+(-\d+)?$")


@dataclass(frozen=True)
class Entry:
    dialect: str
    section: str
    id: str
    says: str
    cite: tuple[str, ...]
    check: dict[str, Any] | None

    @property
    def name(self) -> str:
        return f"{self.dialect}:{self.id}"


def contract(dialect: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CONTRACTS / f"{dialect}.yaml").read_text())
    return loaded


def dialects() -> list[str]:
    return sorted(path.stem for path in CONTRACTS.glob("*.yaml"))


def entries(dialect: str) -> list[Entry]:
    document = contract(dialect)
    found: list[Entry] = []
    for section in SECTIONS:
        for raw in document.get(section) or []:
            found.append(
                Entry(
                    dialect=dialect,
                    section=section,
                    id=raw["id"],
                    says=raw["says"],
                    cite=tuple(raw["cite"]),
                    check=raw.get("check"),
                )
            )
    return found


def checked_entries() -> list[Entry]:
    return [entry for dialect in dialects() for entry in entries(dialect) if entry.check is not None]
