"""What one reliability scenario reports, and the settings every scenario runs under."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Settings:
    short: bool  # CI's version: a few seconds to a minute per scenario, same checks
    out_dir: Path  # logs, ledgers and policies of this run
    say: Callable[[str], None] = print  # progress, one line at a time
    seed: int = 1
    requests: int | None = None  # overrides a scenario's own request count (the soak's ``--requests``)
    duration_s: float | None = None  # overrides a timed scenario's length (the chaos row's ``--duration-s``)


@dataclass
class Row:
    """One line of the table. ``problems`` names every check that failed (empty: the row passed);
    ``leaks`` names what was left behind (tasks, file descriptors, sockets, reservations, rows)."""

    scenario: str
    requests: int = 0
    client_visible_failures: int = 0  # answers that were not what a client asked for, of any kind
    expected_failures: int = 0  # of those, the ones the scenario makes unavoidable (a stream cut mid-way)
    leaks: list[str] = field(default_factory=list)
    memory_before_bytes: int | None = None  # the gateway's PSS after warm-up
    memory_after_bytes: int | None = None  # and at the end
    problems: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems and not self.leaks

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


# A scenario: settings in, rows out. Registered by name in bench/reliability/__main__.py.
Scenario = Callable[[Settings], list[Row]]
