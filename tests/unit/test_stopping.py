"""``gateway.runtime.stopping``: a stage that never ends, or a background loop that swallows its cancellation
(Python 3.11's ``wait_for`` can, when its inner wait ends as the cancellation arrives), is left behind
at its bound and named; the stages after it still run."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.runtime.stopping import Stage, cancel_tasks, close_in_stages


async def stubborn_loop(ticks: list[int]) -> None:
    """A loop that takes a cancellation for a hiccup and carries on."""
    while True:
        try:
            await asyncio.sleep(0.01)
            ticks.append(1)
        except asyncio.CancelledError:
            continue


def test_a_stage_that_never_ends_is_left_behind_and_the_next_one_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran: list[str] = []

    async def forever() -> None:
        await asyncio.Event().wait()

    async def ledger() -> None:
        ran.append("ledger")

    async def stop() -> list[str]:
        outcomes = await close_in_stages(
            [Stage("store", forever, 0.2, lambda: "3 settlements unsent"), Stage("ledger", ledger, 1.0)]
        )
        return [o.outcome for o in outcomes]

    with caplog.at_level(logging.INFO, logger="gateway"):
        assert asyncio.run(stop()) == ["overran", "done"]
    assert ran == ["ledger"]
    assert "stop: store still running after 0.2 s" in caplog.text
    assert "3 settlements unsent" in caplog.text and "in forever" in caplog.text


def test_the_whole_close_shares_one_budget() -> None:
    async def slow() -> None:
        await asyncio.sleep(60)

    async def stop() -> list[str]:
        stages = [Stage(f"stage {n}", slow, 10.0) for n in range(3)]
        return [o.outcome for o in await close_in_stages(stages, budget_s=0.3)]

    assert asyncio.run(stop()) == ["overran"] * 3


def test_a_stage_that_fails_is_logged_and_the_stop_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise OSError("disk gone")

    async def fine() -> None:
        return None

    async def stop() -> list[str]:
        return [o.outcome for o in await close_in_stages([Stage("a", broken, 1.0), Stage("b", fine, 1.0)])]

    with caplog.at_level(logging.INFO, logger="gateway"):
        assert asyncio.run(stop()) == ["failed", "done"]
    assert "stop: a failed" in caplog.text and "disk gone" in caplog.text


def test_a_loop_that_swallows_its_cancellation_cannot_hold_the_stop(caplog: pytest.LogCaptureFixture) -> None:
    ticks: list[int] = []

    async def stop() -> bool:
        task = asyncio.get_running_loop().create_task(stubborn_loop(ticks), name="fleet-sync")
        await asyncio.sleep(0.05)
        await cancel_tasks([task], 0.2)
        still_running = not task.done()
        task.cancel()
        return still_running

    with caplog.at_level(logging.ERROR, logger="gateway"):
        # asyncio.run cancels what is left at its end: the loop swallows that too, so run it in a
        # loop of our own that we close without waiting for it.
        loop = asyncio.new_event_loop()
        try:
            assert loop.run_until_complete(stop())
        finally:
            loop.close()
    assert "background task fleet-sync ignored its cancellation" in caplog.text
    assert ticks, "the loop ran"
