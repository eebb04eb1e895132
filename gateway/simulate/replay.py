"""Past traffic as a workload: arrival times, routes, stream flags, prompt and completion tokens of the
ledger's rows (``--workload ledger:var/ledger.sqlite3 --since 24h``, or a ``postgresql://`` URL),
read through gateway.ledger.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path

from gateway.ledger import LedgerUnavailable, is_url, open_database
from gateway.simulate.workload import SimRequest, Workload, WorkloadError

# A request that failed produced nothing to learn its length from: it gets its route's median.
FALLBACK_OUTPUT_TOKENS = 1000
TAIL_S = 1.0  # the run lasts until this long after the last arrival (pools are paid until then)


def ledger_workload(path: str | Path, since: float) -> Workload:
    if not is_url(path) and not Path(path).is_file():
        raise WorkloadError(f"ledger {path}: no such file")
    try:
        with open_database(path).reading() as reader:
            rows = reader.replay_rows(since)
    except LedgerUnavailable as exc:
        raise WorkloadError(f"ledger {path}: cannot read it: {exc}") from None
    if not rows:
        raise WorkloadError(f"ledger {path}: no requests in the window asked for (--since)")
    answered: dict[str, list[int]] = defaultdict(list)
    for row in rows:
        if row.status == "ok" and row.completion_tokens > 0:
            answered[row.route].append(row.completion_tokens)
    medians = {route: int(statistics.median(values)) for route, values in answered.items()}
    start = rows[0].time
    requests = []
    for row in rows:
        output = row.completion_tokens
        if row.status != "ok" or output <= 0:
            output = medians.get(row.route, FALLBACK_OUTPUT_TOKENS)
        reasoning = min(row.reasoning_tokens, output)
        requests.append(
            SimRequest(row.time - start, row.route, row.prompt_tokens, output, reasoning, None, row.stream)
        )
    duration = requests[-1].at + TAIL_S
    return Workload(f"ledger:{path}", requests, duration, start, {}, (), 0)
