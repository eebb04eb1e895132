"""The ``dies_for_s`` fault over real HTTP: the server dies under its requests (a pool's machine gone), every
stream it holds is cut where it stands, nothing connects while it is down, and it comes back empty."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from tests.emulator.conftest import StartEmulator
from tests.emulator.sse import chat_body

SCALE = 0.01  # an emulated second is 10 ms: 100,000 tokens outlast the test, 300 s down is 3 s real
DOWN_S = 300.0


async def _read_stream(client: httpx.AsyncClient, frames: list[str], started: asyncio.Event) -> None:
    async with client.stream("POST", "/v1/chat/completions", json=chat_body()) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                frames.append(line)
                if len(frames) >= 3:
                    started.set()


async def test_a_death_cuts_every_stream_held_and_refuses_connections_while_down(
    emulator: StartEmulator,
) -> None:
    server = emulator("b300-vllm", time_scale=SCALE)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        # Decoding 20x slower than the profile: at full speed the stream is 9,200 frames a real second,
        # which a slow machine's client reads without ever yielding, so nothing else it asks is answered
        # before the whole 100,000 tokens are in (the stream then ended before the death it waits for).
        faults = {"seats": 1, "content_tokens": 100_000, "slowdown": 20.0}
        await client.post("/emulator/faults", json=faults)
        decoding: list[str] = []
        queued: list[str] = []
        first_frames, never = asyncio.Event(), asyncio.Event()
        in_seat = asyncio.create_task(_read_stream(client, decoding, first_frames))
        await asyncio.wait_for(first_frames.wait(), 20)
        in_queue = asyncio.create_task(_read_stream(client, queued, never))
        for _ in range(2000):  # until the second stream waits for the seat
            if (await client.get("/emulator/state")).json()["waiting"] >= 1:
                break
            await asyncio.sleep(0.01)

        died = await client.post("/emulator/faults", json={"dies_for_s": DOWN_S})
        assert died.status_code == 200 and died.json()["dies_for_s"] is None  # acted on once

        for stream in (in_seat, in_queue):
            with pytest.raises(httpx.RemoteProtocolError):
                await asyncio.wait_for(stream, 20)
        assert len(decoding) >= 3 and "[DONE]" not in "".join(decoding)  # cut mid-answer
        assert not any("[DONE]" in frame for frame in queued)
        async with httpx.AsyncClient(base_url=server.url) as fresh:  # no kept-alive connection
            with pytest.raises(httpx.ConnectError):  # a dead machine: no connection at all
                await fresh.get("/health")

        for _ in range(2000):  # back after its emulated DOWN_S (3 s real); polled, never timed
            try:
                if (await client.get("/health")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.01)
        state = (await client.get("/emulator/state")).json()
        assert (state["running"], state["waiting"]) == (0, 0)  # every seat and place freed
        await client.delete("/emulator/faults")
        async with client.stream("POST", "/v1/chat/completions", json=chat_body()) as response:
            assert response.status_code == 200
            text = (await response.aread()).decode()
        assert "[DONE]" in text


async def test_a_death_for_no_time_cuts_the_streams_and_keeps_answering(emulator: StartEmulator) -> None:
    server = emulator("a100-llamacpp", time_scale=SCALE)
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        await client.post("/emulator/faults", json={"content_tokens": 100_000})
        frames: list[str] = []
        started = asyncio.Event()
        stream = asyncio.create_task(_read_stream(client, frames, started))
        await asyncio.wait_for(started.wait(), 20)
        await client.post("/emulator/faults", json={"dies_for_s": 0, "content_tokens": 2})
        with pytest.raises(httpx.RemoteProtocolError):
            await asyncio.wait_for(stream, 20)
        after = await client.post("/v1/chat/completions", json=chat_body(stream=False))
    assert after.status_code == 200
