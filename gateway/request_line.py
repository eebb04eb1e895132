"""One concise line per finished request, for a person watching a terminal (``gateway demo``):
route -> backend, the decision, TTFT, tokens and cost, so the routing is seen as it happens; and each
refused request with its reason."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import TextIO

from gateway.values.observation import Observation


def request_line(observation: Observation) -> str:
    if observation.status == "refused":  # turned away before any backend: the reason is the news
        key = f", key {observation.api_key_name}" if observation.api_key_name else ""
        route = observation.route or "(no route)"
        return f"{route} -> refused: {observation.error_type}  ({observation.endpoint}{key})"
    final = observation.final
    backend = observation.backend or "-"
    outcome = "ok" if observation.status == "ok" else observation.error_type or "error"
    ttft = "-" if final is None or final.ttft_s is None else f"{final.ttft_s:.2f}s"
    usage = None if final is None else final.usage
    if usage is None:
        tokens = "-"
    else:
        tokens = f"{usage.prompt_tokens} in / {usage.completion_tokens} out"
        if usage.reasoning_tokens:
            tokens += f" ({usage.reasoning_tokens} thinking)"
        if usage.source == "counted":
            tokens += ", counted"
    cost = "-" if observation.cost_usd is None else f"${observation.cost_usd:.6f}"
    if observation.cost_basis:
        cost += f" {observation.cost_basis}"
    retries = f"  after {len(observation.attempts) - 1} failed" if len(observation.attempts) > 1 else ""
    return (
        f"{observation.route} -> {backend}  {observation.decision_reason or '-'}  {outcome}  "
        f"ttft {ttft}  tokens {tokens}  cost {cost}{retries}"
    )


def line_printer(out: TextIO | None = None) -> Callable[[Observation], None]:
    """A listener for the runtime's finished requests that prints ``request_line``; never raises."""

    def print_line(observation: Observation) -> None:
        # A closed terminal (or a bug here) must not fail the request path.
        with contextlib.suppress(Exception):
            print(request_line(observation), file=out or sys.stdout, flush=True)

    return print_line
