"""The paced-stream search of ``bench.run``: which concurrencies it tries against a proxy whose
capacity is known, up to the harness's own limit."""

from __future__ import annotations

import asyncio

from bench.suite import capacity_search, steps_within

STEPS = (16, 32, 64, 128, 256, 512, 1024)


def search(capacity: int, steps: list[int], refine: int) -> tuple[int | None, int | None, list[int]]:
    tried: list[int] = []

    async def holds_at(c: int) -> bool:
        tried.append(c)
        return c <= capacity

    held, failed = asyncio.run(capacity_search(holds_at, steps, refine))
    return held, failed, tried


def test_the_harness_limit_is_a_step_of_its_own() -> None:
    assert steps_within(STEPS, 448) == [16, 32, 64, 128, 256, 448]
    assert steps_within(STEPS, 512) == [16, 32, 64, 128, 256, 512]
    assert steps_within(STEPS, None) == list(STEPS)
    assert steps_within(STEPS, 8) == [8]


def test_a_proxy_that_holds_up_to_the_limit_is_measured_at_it() -> None:
    held, failed, tried = search(10_000, steps_within(STEPS, 448), refine=2)
    assert (held, failed) == (448, None)
    assert tried[-1] == 448


def test_a_failed_step_is_bisected_from_the_last_that_held() -> None:
    held, failed, tried = search(300, steps_within(STEPS, 448), refine=2)
    assert tried == [16, 32, 64, 128, 256, 448, 352, 304]
    assert (held, failed) == (256, 304)


def test_a_first_step_that_fails_is_halved() -> None:
    held, failed, tried = search(5, list(STEPS), refine=1)
    assert tried == [16, 8, 4, 6]
    assert (held, failed) == (4, 6)
