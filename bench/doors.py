"""What the translating front doors cost per chunk and per request, against the chat door (which
translates nothing), and what a ``dialect: litellm`` backend costs against an OpenAI-compatible one.

``python -m bench.doors [--chunks 96] [--streams 200] [--requests 30]``:
  per chunk: the relay's work on one upstream event (StreamMeter.feed, then the door's translate()),
    over a vLLM-shaped stream of reasoning + answer tokens, timed over ``--streams`` whole streams;
  end to end: one streamed request through the gateway on loopback emulators (time scale 1e-4, so the
    emulated model is nearly free), median wall time per request per door, and per backend kind.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import uvicorn

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

HELLO = [{"role": "user", "content": "Hello there, gateway."}]


def upstream_events(tokens: int) -> list[bytes]:
    """A vLLM stream as the emulator sends it: role chunk, half reasoning, half answer, usage, [DONE]."""
    from gateway.emulator.dialects import VllmDialect
    from gateway.emulator.turn import Timings, Turn

    turn = Turn("chat", "chatcmpl-bench", 0, "m", 12, 0, tokens // 2, tokens - tokens // 2, "stop",
                True, False, False, "reasoning")  # fmt: skip
    dialect = VllmDialect()
    frames = [*dialect.head(turn), *(dialect.token(turn, i) for i in range(tokens))]
    frames += dialect.tail(turn, Timings(0, 12, 0.0, tokens, 0.0))
    return [b"data: " + orjson.dumps(f) + b"\n\n" for f in frames] + [b"data: [DONE]\n\n"]


def per_chunk_us(door: str, events: list[bytes], streams: int) -> float:
    """Microseconds of relay work per upstream event: the meter, plus the translator when there is one."""
    from gateway.doors.anthropic_stream import MessagesStream
    from gateway.doors.responses_answer import response_shell
    from gateway.doors.responses_stream import ResponsesStream
    from gateway.measure.meter import StreamMeter
    from gateway.values.observation import Attempt

    def translator() -> Any:
        if door == "messages":
            return MessagesStream("kimi-k3", 12, "req")
        if door == "responses":
            return ResponsesStream(response_shell({"messages": HELLO}, "kimi-k3", "req"))
        return None

    started = time.perf_counter()
    for _ in range(streams):
        meter = StreamMeter(Attempt("b", 0.0), client_wants_usage=door != "chat", prompt_tokens=12)
        out = translator()
        for event in events:
            data = meter.feed(event, 1.0)
            if data and out is not None:
                out.translate(data)
    return (time.perf_counter() - started) / (streams * len(events)) * 1e6


class Server:
    def __init__(self, app: Any) -> None:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=lambda: asyncio.run(self.server.serve()), daemon=True)

    @property
    def url(self) -> str:
        (sock,) = [s for srv in self.server.servers for s in srv.sockets]
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@contextlib.contextmanager
def serving(app: Any) -> Iterator[Server]:
    server = Server(app)
    server.thread.start()
    deadline = time.monotonic() + 15
    while not server.server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("server did not start")
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.server.should_exit = True
        server.thread.join(timeout=10)


def policy(vllm: str, paid: str, claude: str) -> str:
    return f"""
backends:
  pool: {{dialect: vllm, url: {vllm}/v1, model: m, thinking: mandatory,
         pricing: {{gpu_hours: {{usd_per_hour: 60}}}}}}
  api: {{dialect: openai, url: {paid}/v1, model: m, thinking: mandatory, api_key_env: BENCH_KEY,
        pricing: {{per_token: {{input_usd_per_mtok: 3, output_usd_per_mtok: 15}}}}}}
  claude: {{dialect: litellm, url: {claude}, model: anthropic/claude-emulated-4,
           thinking: mandatory, api_key_env: BENCH_KEY,
           pricing: {{per_token: {{input_usd_per_mtok: 3, output_usd_per_mtok: 15}}}}}}
routes:
  pool: {{backends: [pool]}}
  api: {{backends: [api]}}
  claude: {{backends: [claude]}}
"""


def interleaved_ms(sends: dict[str, Callable[[], None]], requests: int) -> dict[str, float]:
    """Median milliseconds per request of each sender, taken in rounds so drift hits all alike."""
    for send in sends.values():
        send()  # warm: connections, imports, first-use caches
    times: dict[str, list[float]] = {name: [] for name in sends}
    for _ in range(requests):
        for name, send in sends.items():
            started = time.perf_counter()
            send()
            times[name].append((time.perf_counter() - started) * 1000)
    return {name: statistics.median(values) for name, values in times.items()}


def end_to_end(requests: int) -> dict[str, float]:
    from gateway.app import create_app
    from gateway.emulator import create_emulator_app
    from gateway.policy.reload import PolicyHolder
    from gateway.runtime import Runtime

    os.environ["BENCH_KEY"] = os.environ["EMULATOR_API_KEY"] = "bench"
    scale = 1e-4
    with (
        serving(create_emulator_app("b300-vllm", time_scale=scale)) as vllm,
        serving(create_emulator_app("paid-api", time_scale=scale)) as paid,
        serving(create_emulator_app("anthropic-api", time_scale=scale)) as claude,
        tempfile.TemporaryDirectory() as tmp,
    ):
        path = Path(tmp) / "policy.yaml"
        path.write_text(policy(vllm.url, paid.url, claude.url))
        holder = PolicyHolder(path)
        app = create_app(lambda: Runtime(holder, ledger_path=Path(tmp) / "ledger.sqlite3"))
        with serving(app) as gateway, httpx.Client(base_url=gateway.url, timeout=60) as client:

            def stream(path: str, body: dict[str, Any]) -> Callable[[], None]:
                def send() -> None:
                    with client.stream("POST", path, json={**body, "stream": True}) as response:
                        response.read()
                        assert response.status_code == 200, response.text

                return send

            chat = {"messages": HELLO}
            sends = {
                "chat door, vLLM pool": stream("/v1/chat/completions", {"model": "pool", **chat}),
                "messages door, vLLM pool": stream(
                    "/v1/messages", {"model": "pool", "max_tokens": 1000, **chat}
                ),
                "responses door, vLLM pool": stream(
                    "/v1/responses", {"model": "pool", "input": "Hello there"}
                ),
                "chat door, OpenAI-compatible API": stream("/v1/chat/completions", {"model": "api", **chat}),
                "chat door, litellm -> Messages API": stream(
                    "/v1/chat/completions", {"model": "claude", **chat}
                ),
            }
            return interleaved_ms(sends, requests)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--chunks", type=int, default=96, help="tokens per stream (half reasoning)")
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args(argv)
    events = upstream_events(args.chunks)
    print(f"per upstream event ({len(events)} events a stream, {args.streams} streams):")
    base = per_chunk_us("chat", events, args.streams)
    for door in ("chat", "messages", "responses"):
        us = base if door == "chat" else per_chunk_us(door, events, args.streams)
        print(f"  {door:<10} {us:6.2f} us/chunk  (+{us - base:5.2f} over chat)")
    print(f"end to end, one streamed request ({args.chunks} tokens), median of {args.requests}:")
    for name, ms in end_to_end(args.requests).items():
        print(f"  {name:<36} {ms:7.2f} ms")


if __name__ == "__main__":
    main()
