"""A month of a fleet's ledger rows, fast: the real schema (``gateway.ledger.COLUMNS``) with plausible
distributions (routes and their backends, 60 teams' keys, thousands of users, eight gateway replicas,
thinking-heavy Kimi outputs, agent sessions' long cached prompts, errors, fallbacks and refusals), a
weekday/weekend and hour-of-day curve, ending now so "today" and "the last hour" have rows. Written
into PostgreSQL by COPY and into SQLite by ``executemany``, both through the ledger's own migrations
and its rollup trigger (so the rollup is built the way a gateway builds it).

    python -m bench.ledger_volume --rows 1000000 --ledger /tmp/month.sqlite3
    python -m bench.ledger_volume --rows 10000000 --ledger postgresql://postgres@127.0.0.1/month
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import math
import random
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.ledger import COLUMNS, is_url, open_database
from gateway.ledger.migrations import TRACKING_TABLE, migrations

DAY_S = 86_400
HOUR_S = 3600
# Requests per hour of the day (UTC), relative: a working-day hump with an evening shoulder.
HOUR_CURVE = (
    0.25,
    0.2,
    0.18,
    0.18,
    0.2,
    0.3,
    0.5,
    0.8,
    1.1,
    1.35,
    1.5,
    1.55,
    1.5,
    1.55,
    1.6,
    1.55,
    1.45,
    1.3,
    1.1,
    0.95,
    0.8,
    0.65,
    0.5,
    0.35,
)
WEEKEND = 0.45  # a weekend day's traffic relative to a weekday's


@dataclass(frozen=True, slots=True)
class Route:
    name: str
    share: float
    endpoint: str
    backends: tuple[tuple[str, str, float], ...]  # (backend, upstream model, share)
    prompt_median: float
    completion_median: float
    reasoning_share: float  # of completion tokens, for a thinking model
    cached_share: float  # of prompt tokens served from the prefix cache


ROUTES = (
    Route(
        "kimi-k3",
        0.44,
        "chat",
        (*((f"b300-vllm-{i}", "moonshotai/Kimi-K3", 0.115) for i in range(8)), ("kimi-api", "kimi-k3", 0.08)),
        2_500,
        900,
        0.55,
        0.35,
    ),
    Route(
        "kimi-k3-agents",
        0.30,
        "messages",
        (*((f"b300-vllm-{i}", "moonshotai/Kimi-K3", 0.12) for i in range(8)), ("kimi-api", "kimi-k3", 0.04)),
        38_000,
        700,
        0.45,
        0.85,
    ),
    Route(
        "chat-small",
        0.15,
        "chat",
        (("h200-sglang-0", "Qwen3-32B", 0.5), ("h200-sglang-1", "Qwen3-32B", 0.5)),
        900,
        350,
        0.0,
        0.2,
    ),
    Route("gpt-fallback", 0.08, "responses", (("openai", "gpt-5-mini", 1.0),), 3_000, 600, 0.4, 0.5),
    Route("embed", 0.03, "embeddings", (("h200-embed", "Qwen3-Embedding-8B", 1.0),), 400, 0, 0.0, 0.0),
)
PAID = {"kimi-api": (0.6, 2.5), "openai": (0.25, 2.0)}  # USD per 1M prompt, completion tokens
POOL_USD_PER_MTOK = {"b300": (0.05, 0.9), "h200": (0.03, 0.4)}  # amortized GPU-hours, per 1M tokens
REFUSALS = (
    ("rate_limit_exceeded", 0.45),
    ("budget_exceeded", 0.2),
    ("invalid_request", 0.2),
    ("model_not_found", 0.15),
)
ERRORS = ("upstream_failed", "upstream_timeout", "upstream_dropped", "context_length_exceeded")
TEAMS = ("search", "support", "code", "data", "legal", "ads", "infra", "mobile", "web", "research")


def zipf_weights(count: int, exponent: float = 1.1) -> list[float]:
    return [1.0 / (rank**exponent) for rank in range(1, count + 1)]


KEYS = [f"team-{TEAMS[i % len(TEAMS)]}-{['prod', 'staging', 'batch'][i % 3]}-{i}" for i in range(60)]
KEY_WEIGHTS = zipf_weights(len(KEYS))
USERS = [hashlib.blake2b(f"user-{i}".encode(), digest_size=8).hexdigest() for i in range(8000)]
USER_WEIGHTS = zipf_weights(len(USERS), 0.9)
REPLICAS = [f"gw-{i}" for i in range(8)]


def hours_of(end: float, days: int) -> list[tuple[float, float]]:
    """(hour start, relative traffic) for the ``days`` days before ``end`` (an hour's start)."""
    first = end - days * DAY_S
    out = []
    for n in range(days * 24):
        start = first + n * HOUR_S
        weekday = time.gmtime(start).tm_wday
        out.append((start, HOUR_CURVE[time.gmtime(start).tm_hour] * (WEEKEND if weekday >= 5 else 1.0)))
    return out


def month_rows(
    total: int, end: float, *, days: int = 30, seed: int = 1, chunk: int = 200_000
) -> Iterator[list[tuple[Any, ...]]]:
    """``total`` rows in ``COLUMNS`` order (with a row key), oldest first, in chunks; the last hour
    before ``end`` is filled up to ``end`` only."""
    rng = random.Random(seed)
    end_hour = math.floor(end / HOUR_S) * HOUR_S
    hours = hours_of(end_hour + HOUR_S, days)
    weight = sum(w for _, w in hours)
    counts = [int(total * w / weight) for _, w in hours]
    counts[-1] += total - sum(counts)
    made = 0
    pending: list[tuple[Any, ...]] = []
    for (start, _), count in zip(hours, counts, strict=True):
        span = min(HOUR_S, end - start) if start + HOUR_S > end else HOUR_S
        times = sorted(start + rng.random() * span for _ in range(count))
        pending.extend(_rows(rng, times, made, seed))
        made += count
        if len(pending) >= chunk:
            yield pending
            pending = []
    if pending:
        yield pending


def _rows(rng: random.Random, times: list[float], first: int, seed: int) -> Iterator[tuple[Any, ...]]:
    n = len(times)
    routes = rng.choices(ROUTES, [r.share for r in ROUTES], k=n)
    keys = rng.choices(KEYS, KEY_WEIGHTS, k=n)
    users = rng.choices(USERS, USER_WEIGHTS, k=n)
    replicas = rng.choices(REPLICAS, k=n)
    for i, (at, route, key, user, replica) in enumerate(
        zip(times, routes, keys, users, replicas, strict=True)
    ):
        number = first + i
        draw = rng.random()
        if draw < 0.009:  # refused before a backend: no cost, often no route
            reason = rng.choices([r for r, _ in REFUSALS], [w for _, w in REFUSALS])[0]
            name = "" if reason in ("invalid_request", "model_not_found") else route.name
            yield _row(
                at,
                number,
                seed,
                key,
                name,
                route.endpoint,
                None,
                None,
                0,
                0,
                0,
                0,
                None,
                0.0,
                None,
                "refused",
                reason,
                0,
                None,
                replica,
                user,
                "[]",
            )
            continue
        backend, model = rng.choices([(b, m) for b, m, _ in route.backends], [s for *_, s in route.backends])[
            0
        ]
        prompt = max(1, int(rng.lognormvariate(math.log(route.prompt_median), 0.9)))
        cached = int(prompt * route.cached_share * rng.random() * 2) if route.cached_share else 0
        cached = min(cached, prompt)
        completion = (
            0
            if not route.completion_median
            else max(1, int(rng.lognormvariate(math.log(route.completion_median), 1.0)))
        )
        reasoning = (
            int(completion * route.reasoning_share * (0.5 + rng.random())) if route.reasoning_share else 0
        )
        reasoning = min(reasoning, completion)
        status, error, attempts = "ok", None, 1
        if draw < 0.024:
            status, error = "error", rng.choice(ERRORS)
        elif draw < 0.031:
            status = "cancelled"
        if rng.random() < 0.035:
            attempts = 2 if rng.random() < 0.9 else 3
        if backend in PAID:
            usd_in, usd_out = PAID[backend]
            basis, prefill = "per_token", None
            cost = ((prompt - cached) * usd_in + cached * usd_in * 0.1 + completion * usd_out) / 1e6
        else:
            usd_in, usd_out = POOL_USD_PER_MTOK[backend[:4]]
            basis = "gpu_hours_amortized"
            prefill = (prompt - cached) * usd_in / 1e6
            cost = prefill + completion * usd_out / 1e6
        if status == "error" and completion:
            completion = reasoning = int(completion * rng.random() * 0.3)
        yield _row(
            at,
            number,
            seed,
            key,
            route.name,
            route.endpoint,
            backend,
            model,
            prompt,
            cached,
            completion,
            reasoning,
            basis,
            cost,
            prefill,
            status,
            error,
            attempts,
            rng.random(),
            replica,
            user,
            f'[{{"backend":"{backend}","status":"{status}","http_status":200,"prompt_tokens":{prompt},'
            f'"completion_tokens":{completion},"cost_usd":{cost:.8f},"resumed":null}}]',
        )


def _row(
    at: float,
    number: int,
    seed: int,
    key: str,
    route: str,
    endpoint: str,
    backend: str | None,
    model: str | None,
    prompt: int,
    cached: int,
    completion: int,
    reasoning: int,
    basis: str | None,
    cost: float,
    prefill: float | None,
    status: str,
    error: str | None,
    attempts: int,
    speed: float | None,
    replica: str,
    user: str,
    attempt_log: str,
) -> tuple[Any, ...]:
    answered = status != "refused"
    ttft = 0.25 + prompt / 40_000 if answered else None
    decode = 40.0 + 60.0 * speed if speed is not None else None
    duration = (ttft or 0.0) + (completion / decode if decode else 0.0)
    return (
        at,
        f"req-{seed:02x}{number:012x}",
        key,
        route,
        endpoint,
        endpoint != "embeddings" and answered,
        backend,
        model,
        prompt,
        cached,
        completion,
        reasoning,
        "reported" if answered else None,
        cost,
        basis,
        cost * 1.3 if answered else None,
        ttft,
        ttft,
        decode,
        duration,
        status,
        error,
        attempts,
        "cheapest_feasible" if answered else None,
        replica,
        prefill,
        0.0,
        attempt_log,
        False,
        user,
        cached if route == "kimi-k3-agents" else None,
        f"vol{seed}-{number}",
    )


@dataclass(frozen=True, slots=True)
class Loaded:
    rows: int
    load_s: float  # the raw rows in (COPY or executemany), indexes built
    migrate_s: float  # the rollup's migration over those rows (its first fill)


def write(target: str | Path, total: int, end: float, *, seed: int = 1, progress: bool = True) -> Loaded:
    """Fill a new ledger at ``target`` the way an existing one would meet this version: the schema
    before the rollup, ``total`` rows, then ``open()``, whose migration sums the rows into the rollup
    (the path a ledger with months of rows takes on upgrade); the trigger takes over from there."""
    dialect = "postgresql" if is_url(target) else "sqlite"
    rollup = next(m.version for m in migrations(dialect) if m.name == "spend_rollup")
    started = time.perf_counter()
    if is_url(target):
        _load_postgresql(str(target), rollup, total, end, seed, progress)
    else:
        _load_sqlite(Path(target), rollup, total, end, seed, progress)
    loaded = time.perf_counter()
    database = open_database(target)
    database.open()
    database.close()
    if is_url(target):
        import psycopg

        with psycopg.connect(str(target), autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE spend_rollup")
    return Loaded(total, loaded - started, time.perf_counter() - loaded)


def _load_postgresql(url: str, rollup: int, total: int, end: float, seed: int, progress: bool) -> None:
    import psycopg

    names = ", ".join(COLUMNS)
    with psycopg.connect(url) as conn:
        conn.execute(TRACKING_TABLE)
        for migration in migrations("postgresql")[: rollup - 1]:
            for statement in migration.statements:
                conn.execute(statement.encode())
            conn.execute(
                "INSERT INTO schema_migrations VALUES (%s, %s, 0)", (migration.version, migration.name)
            )
        # The bulk-load recipe: secondary indexes dropped, then built once by sorting (inserting 10M
        # rows into nine B-trees one at a time is what makes a load take an hour).
        found = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes"
            " WHERE tablename = 'requests' AND indexname <> 'requests_pkey'"
        ).fetchall()
        for name, _ in found:
            conn.execute(f"DROP INDEX {name}".encode())
        conn.commit()
        written, started = 0, time.perf_counter()
        for chunk in month_rows(total, end, seed=seed):
            with conn.cursor() as cursor, cursor.copy(f"COPY requests ({names}) FROM STDIN".encode()) as copy:
                for row in chunk:
                    copy.write_row(row)
            conn.commit()
            written += len(chunk)
            _progress(progress, written, total, started)
        for _, definition in found:
            conn.execute(str(definition).encode())
            conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE requests")


def _load_sqlite(path: Path, rollup: int, total: int, end: float, seed: int, progress: bool) -> None:
    insert = f"INSERT INTO requests ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute(TRACKING_TABLE)
        for migration in migrations("sqlite")[: rollup - 1]:
            for statement in migration.statements:
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, 0)", (migration.version, migration.name)
            )
        written, started = 0, time.perf_counter()
        for chunk in month_rows(total, end, seed=seed):
            conn.execute("BEGIN")
            conn.executemany(insert, chunk)
            conn.execute("COMMIT")
            written += len(chunk)
            _progress(progress, written, total, started)
        conn.execute("ANALYZE")


def _progress(show: bool, written: int, total: int, started: float) -> None:
    if show:
        elapsed = time.perf_counter() - started
        print(f"  {written:,}/{total:,} rows, {elapsed:.0f} s, {written / elapsed:,.0f} rows/s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--ledger", required=True, help="a SQLite file or a postgresql:// URL")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    done = write(args.ledger, args.rows, time.time(), seed=args.seed)
    migrated = f"the rollup's migration summed them in {done.migrate_s:.0f} s"
    print(
        f"{args.rows:,} rows into {args.ledger}: loaded in {done.load_s:.0f} s "
        f"({args.rows / done.load_s:,.0f} rows/s); {migrated}"
    )


if __name__ == "__main__":
    main()
