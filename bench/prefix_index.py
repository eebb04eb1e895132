"""Microbenchmark of the prefix index on the request path: a request's keys (``prompt_keys``), the
lookup over a route's candidates (``expected_cached_many``) and, after the answer, ``record``, with
10,000 live conversations held over three backends. The target (issue 30): keys + lookup <= 5 us.

The keys are made as the request path makes them: in a key's cache scope (a seed), each
conversation's next turn carried from its previous one (``KeyCarry``: only its new message hashed);
``keys_hashed_whole`` is a prompt without a client key, all ~230 KB of it hashed.

    python -m bench.prefix_index [--sessions 10000] [--messages 22] [--json out.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from gateway.measure.prefix_index import KeyCarry, PrefixIndex, PromptKeys, prompt_keys

BACKENDS = ("b300-a", "b300-b", "api")
SAMPLED = 1000  # of the live sessions, those whose next turn is sent (each ~200 KB of JSON)
SEED = 0x5EED_0F_A_CA11E4  # the cache scope of one API key (policy/cache_scope.py derives them)
SYSTEM = "You are a coding agent working in a repository. Follow the instructions. " * 150


def conversation(rng: random.Random, session: int, messages: int) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for i in range(messages - 1):
        role = "user" if i % 2 == 0 else "assistant"
        size = rng.randint(200, 20_000)  # tool results and answers of very different sizes
        turns.append({"role": role, "content": f"s{session} m{i} " + "x" * size})
    return turns


def _chars(messages: list[dict[str, Any]]) -> int:
    return sum(len(m["content"]) for m in messages)


def _timed(
    n: int, call: Callable[[int], object], prepare: Callable[[int], object] | None = None
) -> dict[str, float]:
    times = []
    gc.disable()
    try:
        for i in range(n):
            if prepare is not None:
                prepare(i)
            start = time.perf_counter_ns()
            call(i)
            times.append(time.perf_counter_ns() - start)
    finally:
        gc.enable()
    times.sort()
    return {
        "mean_us": sum(times) / n / 1000.0,
        "p50_us": times[n // 2] / 1000.0,
        "p99_us": times[int(n * 0.99)] / 1000.0,
    }


def run(sessions: int = 10_000, messages: int = 22, iterations: int = 20_000) -> dict[str, Any]:
    rng = random.Random(7)
    index = PrefixIndex(lambda name: 300.0, lambda name: 10**12)
    carry = KeyCarry()  # as the runtime's (measure/prefixes.py)
    payloads = []
    now = 0.0
    for session in range(sessions):
        convo = conversation(rng, session, messages)
        keys = prompt_keys({"messages": convo}, _chars(convo), 4.0, f"session-{session}", SEED, carry)
        index.record(BACKENDS[session % len(BACKENDS)], keys, now)
        if session % (sessions // SAMPLED) == 0:  # the next turns sent: a sample, to bound memory
            nxt = [*convo, {"role": "user", "content": f"next turn of {session} " + "y" * 500}]
            payloads.append((orjson.dumps({"messages": nxt}), _chars(nxt), f"session-{session}"))
        now += 0.01
    picks = [rng.randrange(len(payloads)) for _ in range(iterations)]
    ready: list[PromptKeys] = []
    parsed: list[dict[str, Any]] = [{}]

    def parse(i: int) -> None:
        # As the gateway does just before: the body parsed (~200 KB: most of the CPU caches) and its
        # characters counted (the door's prompt_chars), so the payload's objects are fresh and the
        # index's are not.
        parsed[0] = orjson.loads(payloads[picks[i]][0])
        _chars(parsed[0]["messages"])

    def keys_only(i: int) -> None:
        _, chars, client_key = payloads[picks[i]]
        ready.append(prompt_keys(parsed[0], chars, 4.0, client_key, SEED, carry))

    keys = _timed(iterations, keys_only, parse)

    def keys_whole(i: int) -> None:
        prompt_keys(parsed[0], payloads[picks[i]][1], 4.0, None, SEED)

    whole = _timed(max(1, iterations // 10), keys_whole, parse)
    lookup = _timed(iterations, lambda i: index.expected_cached_many(BACKENDS, ready[i], now))

    def both(i: int) -> None:
        _, chars, client_key = payloads[picks[i]]
        index.expected_cached_many(BACKENDS, prompt_keys(parsed[0], chars, 4.0, client_key, SEED, carry), now)

    request_path = _timed(iterations, both, parse)
    warm = [orjson.loads(body) for body, _, _ in payloads[:100]]

    def both_warm(i: int) -> None:
        # The same with the payload and the index's entries already in the CPU caches: the work itself.
        _, chars, client_key = payloads[i % 100]
        keys = prompt_keys(warm[i % 100], chars, 4.0, client_key, SEED, carry)
        index.expected_cached_many(BACKENDS, keys, now)

    request_path_warm = _timed(iterations, both_warm)
    record = _timed(iterations, lambda i: index.record(BACKENDS[picks[i] % 3], ready[i], now + 1.0))
    hits = sum(1 for k in ready[:1000] if index.expected_cached_many(BACKENDS, k, now + 2.0))
    return {
        "sessions": sessions,
        "messages_per_prompt": messages + 1,
        "entries": {name: int(r["entries"]) for name, r in index.report().items()},
        "keys": keys,
        "keys_hashed_whole": whole,
        "lookup_3_candidates": lookup,
        "keys_and_lookup": request_path,
        "keys_and_lookup_warm": request_path_warm,
        "record_after_answer": record,
        "found_share": hits / 1000,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=22)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    result = run(args.sessions, args.messages, args.iterations)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{result['sessions']} live sessions, {result['messages_per_prompt']} messages per prompt")
    for name in (
        "keys",
        "keys_hashed_whole",
        "lookup_3_candidates",
        "keys_and_lookup",
        "keys_and_lookup_warm",
        "record_after_answer",
    ):
        r = result[name]
        print(f"{name:22s} mean {r['mean_us']:6.2f} us  p50 {r['p50_us']:6.2f} us  p99 {r['p99_us']:6.2f} us")
    print(f"prompts found in the index: {result['found_share']:.0%}")


if __name__ == "__main__":
    main()
