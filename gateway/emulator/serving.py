"""One emulated upstream and the lifecycle of a completion request through it.

Checks in the order a deployment meets them: booting, API key, body, rate limit, injected faults, generation.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.emulator.dialect_choice import dialect_for
from gateway.emulator.dialects import openai_error
from gateway.emulator.dying import Death
from gateway.emulator.engine import Engine, Generation, Plan
from gateway.emulator.faults import Faults, RateLimiter, retry_after_headers
from gateway.emulator.parsing import (
    THINK_CLOSE,
    BadRequest,
    CompletionRequest,
    ContinuationStyle,
    Endpoint,
    parse_completion_request,
)
from gateway.emulator.prefix_cache import SALTED_DIALECTS, PrefixCache
from gateway.emulator.profiles import Profile
from gateway.emulator.recording import RequestLog
from gateway.emulator.replies import Abort, Part, Reply, Start
from gateway.emulator.stream_errors import stream_error_tail
from gateway.emulator.turn import Timings, Turn

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
JSON_TYPE = "application/json"
# vLLM, SGLang and llama-server continue a final assistant message, each its own way (parsing.py);
# the paid API takes Kimi's partial mode.
CONTINUATION_STYLES: dict[str, ContinuationStyle] = {
    "vllm": "continue_final_message",
    "sglang": "sglang",
    "llamacpp": "llamacpp",
    "openai": "partial",
}
# The flag without which each engine leaves prompt_tokens_details out (docs/contracts:
# usage.cached_tokens_flag); the other dialects always report cached tokens.
CACHED_TOKENS_FLAGS = {"vllm": "--enable-prompt-tokens-details", "sglang": "--enable-cache-report"}
# Dialects whose server does not listen while the weights load (docs/contracts: health.refused_while_loading).
REFUSE_WHILE_LOADING = frozenset({"vllm", "sglang"})
# vllm/v1/engine/exceptions.py:22 EngineDeadError.CLIENT_MESSAGE, as error_response.py:67-71 sends it.
ENGINE_DEAD_MESSAGE = "The server had an error while processing your request."
BOOTING_MESSAGE = {
    "vllm": "The server is starting up.",
    "llamacpp": "Loading model",
    "openai": "Service starting.",
    "anthropic": "Overloaded",
    "sglang": "The server is starting up.",
}


class Emulator:
    """Everything one emulated upstream shares across requests: engine, dialect, knobs, request log."""

    def __init__(
        self,
        profile: Profile,
        *,
        time_scale: float,
        cold_boot: bool,
        seed: int,
        clock: Callable[[], float],
        api_key: str | None,
    ) -> None:
        self.profile = profile
        self.rng = random.Random(seed)
        self.engine = Engine(profile, time_scale=time_scale, clock=clock, rng=self.rng, cold_boot=cold_boot)
        self.dialect = dialect_for(profile.dialect)
        self.faults = Faults()
        self.requests = RequestLog(clock)
        self._limiter = RateLimiter()
        block = profile.cache_block_tokens
        capacity = profile.cache_capacity_tokens or profile.kv_capacity_tokens
        self._prefix_cache = PrefixCache(
            block,
            capacity // block if block and capacity else 65_536,
            profile.cache_ttl_s,
            profile.cache_min_tokens,
        )
        # Only the paid API checks keys, and only when EMULATOR_API_KEY was set at creation.
        self._api_key = api_key if profile.dialect in ("openai", "anthropic") else None
        flag = CACHED_TOKENS_FLAGS.get(profile.dialect)
        self.reports_cached_tokens = flag is None or flag in profile.engine_args
        self.health_generations = 0  # SGLang: health checks that ran a one-token generation
        self._rebooted = asyncio.Event()
        self.death = Death()  # the dies_for_s fault

    def refuses_connections(self) -> bool:
        """Whether the server is not listening at all now (vLLM and SGLang while loading; any while dead)."""
        loading = self.profile.dialect in REFUSE_WHILE_LOADING and self.engine.loading
        return loading or self.death.down(self.engine.now())

    def loading_left_s(self) -> float:
        """Real seconds until loaded and not dead (``listener.GatedServer`` listens then)."""
        engine = self.engine
        return engine.real_s(max(engine.loading_left_s(), self.death.down_left_s(engine.now())))

    async def reboot(self) -> None:
        """Returns when a cold boot (cold_boot_s) or a death (dies_for_s) begins."""
        self._rebooted.clear()
        await self._rebooted.wait()

    def set_faults(self, faults: Faults) -> None:
        if faults.cold_boot_s is not None:
            self.engine.boot_for(faults.cold_boot_s)
            self._rebooted.set()
            faults = faults.model_copy(update={"cold_boot_s": None})
        if faults.dies_for_s is not None:
            self.death.die(self.engine.now(), faults.dies_for_s)
            self._rebooted.set()  # listener.GatedServer stops listening while it is down
            faults = faults.model_copy(update={"dies_for_s": None})
        self.faults = faults
        self.engine.set_slowdown(faults.slowdown)
        self.engine.set_seats(faults.seats)

    def error_response(self, status: int, message: str) -> Response:
        return json_response(self.dialect.error(status, message), status)

    async def health(self, path: str, *, generation_enabled: bool) -> Response:
        """Health over the server's life (docs/contracts, health): not listening while vLLM or SGLang load,
        503 while llama-server loads or SGLang warms up, 503 from a dead vLLM engine, else 200, after a
        one-token generation on SGLang unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false."""
        if self.refuses_connections():
            return self.refusal_cut()
        dialect = self.profile.dialect
        if self.engine.booting:
            return _health_answer(*self.dialect.health(ready=False))
        if dialect == "vllm" and self.faults.engine_dead:
            return Response(status_code=503)  # vllm/entrypoints/serve/instrumentator/health.py:32-33
        if dialect == "sglang" and (path == "/health_generate" or generation_enabled):
            # A one-token request, polled once a second (sglang/srt/entrypoints/http_server.py:750-784).
            self.health_generations += 1
            await asyncio.sleep(self.profile.health_generation_s)
        return _health_answer(*self.dialect.health(ready=True))

    def refusal_cut(self) -> Response:
        """No answer at all: what a server that is not listening gives, when served in process without
        ``listener.GatedServer`` (which does not even accept the connection)."""
        return Reply(_abort())

    def refusal(self, request: Request) -> Response | None:
        """The answer for any /v1 request this upstream cannot take yet: booting, dead, or a wrong key."""
        if self.refuses_connections():
            return self.refusal_cut()
        if self.engine.booting:
            return self.error_response(503, BOOTING_MESSAGE[self.profile.dialect])
        if self.faults.engine_dead:  # vLLM's EngineDeadError: a 500 on every request
            return self.error_response(500, ENGINE_DEAD_MESSAGE)
        key = self._api_key
        if key is not None and key not in (request.headers.get("x-api-key"), _bearer(request)):
            return self.error_response(401, "Incorrect API key provided.")
        return None

    async def complete(
        self, request: Request, endpoint: Endpoint, body: Any, body_error: str | None
    ) -> Response:
        refused = self.refusal(request)
        if refused is not None:
            return refused
        if body_error is not None:
            return self.error_response(400, body_error)
        try:
            parsed = parse_completion_request(
                body,
                endpoint,
                strict_stream_options=self.profile.dialect != "llamacpp",
                continuation_style=CONTINUATION_STYLES.get(self.profile.dialect, "none"),
                strict_cache_salt=self.profile.dialect == "vllm",
            )
        except BadRequest as exc:
            return self.error_response(400, str(exc))
        too_long = self._context_error(parsed)
        if too_long is not None:
            return too_long
        faults = self.faults
        limited = self._rate_limited(faults)
        if limited is not None:
            return limited
        if faults.error_rate > 0 and self.rng.random() < faults.error_rate:
            return self.error_response(faults.error_status, "Injected fault (error_rate).")
        if faults.hang:
            return Reply(_hang())
        if faults.drop_after_chunks is not None and not parsed.stream:
            return Reply(_abort())
        turn, plan = self._plan(parsed, faults)
        generation = self.engine.generation(plan)
        if parsed.stream:
            stream = self._stream(turn, generation, faults.drop_after_chunks, faults.error_after_chunks)
            return Reply(self.death.cuttable(stream))
        return Reply(self.death.cuttable(self._whole(turn, generation)))

    def state(self) -> dict[str, Any]:
        engine, totals = self.engine, self.engine.totals
        per_stream = engine.per_stream_tokens_per_s()
        return {
            "profile": self.profile.name,
            "dialect": self.profile.dialect,
            "model": self.profile.model,
            "time_scale": engine.time_scale,
            "booting": engine.booting,
            "health_generations": self.health_generations,
            "running": engine.running,
            "waiting": engine.waiting,
            "max_running": self.profile.max_running,
            # Emulated tokens per second (what the real hardware would do); real rates are these / time_scale.
            "per_stream_tokens_per_s": per_stream,
            "aggregate_tokens_per_s": per_stream * engine.running,
            "totals": {
                "requests": totals.requests,
                "finished": totals.finished,
                "completed": totals.completed,
                "prompt_tokens": totals.prompt_tokens,
                "cached_prompt_tokens": totals.cached_prompt_tokens,
                "generation_tokens": totals.generation_tokens,
            },
        }

    # -- steps ---------------------------------------------------------------------------------------

    def _rate_limited(self, faults: Faults) -> Response | None:
        limit = faults.rate_limit_rpm
        wait_s = self._limiter.retry_after_s(self.engine.now(), limit)
        if wait_s is None or limit is None:
            return None
        real_wait_s = self.engine.real_s(wait_s)
        message = f"Rate limit reached: {limit} requests per min. Please try again in {real_wait_s:.3f}s."
        return json_response(openai_error(429, message), 429, retry_after_headers(real_wait_s, limit))

    def _context_error(self, parsed: CompletionRequest) -> Response | None:
        """The engine's own answer to a prompt past its context (docs/contracts: limits.context_length)."""
        context = self.profile.context_tokens
        over = (
            parsed.prompt_tokens >= context
            if self.profile.dialect == "llamacpp"
            else parsed.prompt_tokens > context
        )
        if not over:
            return None
        body = self.dialect.context_error(parsed.prompt_tokens, context, stream=parsed.stream)
        return json_response(body, 400)

    def _plan(self, parsed: CompletionRequest, faults: Faults) -> tuple[Turn, Plan]:
        profile = self.profile
        reasoning = profile.reasoning_tokens if faults.reasoning_tokens is None else faults.reasoning_tokens
        content = profile.content_tokens if faults.content_tokens is None else faults.content_tokens
        content_offset = 0
        if parsed.continuation is not None:
            # Continuing an answer: no thinking again, and the words go on from where the text stopped.
            content_offset = len(parsed.continuation.rsplit(THINK_CLOSE, 1)[-1].split())
            reasoning, content = 0, max(1, content - content_offset)
        finish_reason = "stop" if parsed.tool_name is None else "tool_calls"
        if parsed.max_tokens is not None and parsed.max_tokens < reasoning + content:
            finish_reason = "length"
            reasoning = min(reasoning, parsed.max_tokens)
            content = parsed.max_tokens - reasoning
        salt = parsed.cache_salt if profile.dialect in SALTED_DIALECTS else None
        cached = self._prefix_cache.lookup_and_store(
            parsed.prompt_text, parsed.prompt_tokens, self.engine.now(), salt
        )
        is_vllm = profile.dialect == "vllm"
        asked_continuous = parsed.include_usage and parsed.continuous_usage_stats
        prefix = "chatcmpl" if parsed.endpoint == "chat" else "cmpl"
        turn = Turn(
            endpoint=parsed.endpoint,
            id=f"{prefix}-{self.rng.getrandbits(128):032x}",
            created=int(time.time()),
            model=parsed.model or profile.model,
            prompt_tokens=parsed.prompt_tokens,
            cached_tokens=cached,
            reasoning_tokens=reasoning,
            content_tokens=content,
            finish_reason=finish_reason,
            include_usage=parsed.include_usage,
            continuous_usage=is_vllm
            and not faults.omit_stream_usage
            and (faults.continuous_usage or asked_continuous),
            omit_stream_usage=faults.omit_stream_usage,
            reasoning_field=faults.reasoning_field,
            report_cached=self.reports_cached_tokens,
            content_offset=content_offset,
            answer_as_reasoning=not parsed.continuation_past_thinking,
            tool_name=parsed.tool_name if content else None,
            tool_argument=parsed.tool_argument,
        )
        plan = Plan(
            prompt_tokens=parsed.prompt_tokens,
            cached_tokens=cached,
            reasoning_tokens=reasoning,
            content_tokens=content,
            extra_ttft_s=faults.added_ttft_ms / 1000.0,
        )
        return turn, plan

    async def _stream(
        self, turn: Turn, generation: Generation, drop_after: int | None, error_after: int | None = None
    ) -> AsyncGenerator[Part, None]:
        yield Start(200, SSE_HEADERS)
        sent = 0
        async with contextlib.aclosing(self._frames(turn, generation)) as frames:
            async for frame in frames:
                if drop_after is not None and sent >= drop_after:
                    yield Abort()
                    return
                if error_after is not None and sent >= error_after:
                    for event in stream_error_tail(self.profile.dialect, self._usage_so_far(turn, sent)):
                        yield event
                    return
                yield frame
                sent += 1

    async def _frames(self, turn: Turn, generation: Generation) -> AsyncGenerator[bytes, None]:
        dialect = self.dialect
        emitted = 0
        async with contextlib.aclosing(self.engine.run(generation)) as bursts:
            async for burst in bursts:
                if emitted == 0:
                    for frame in dialect.head(turn):
                        yield _sse(frame)
                for index in range(emitted, emitted + burst):
                    yield _sse(dialect.token(turn, index))
                emitted += burst
        if emitted == 0:
            for frame in dialect.head(turn):
                yield _sse(frame)
        for frame in dialect.tail(turn, self._timings(generation)):
            yield _sse(frame)
        yield b"data: [DONE]\n\n"

    def _usage_so_far(self, turn: Turn, frames_sent: int) -> dict[str, Any] | None:
        """The usage chunk of a stream cut after ``frames_sent`` frames, when the client asked for one."""
        if not turn.include_usage or turn.omit_stream_usage:
            return None
        dialect = self.dialect
        chunk = {**dialect.envelope(turn, stream=True), "choices": []}
        chunk["usage"] = dialect.usage(turn, max(0, frames_sent - len(dialect.head(turn))))
        return chunk

    async def _whole(self, turn: Turn, generation: Generation) -> AsyncGenerator[Part, None]:
        async with contextlib.aclosing(self.engine.run(generation)) as bursts:
            async for _ in bursts:
                pass
        body = orjson.dumps(self.dialect.response(turn, self._timings(generation)))
        yield Start(200, {"content-type": JSON_TYPE, "content-length": str(len(body))})
        yield body

    def _timings(self, generation: Generation) -> Timings:
        plan = generation.plan
        first, last = generation.first_token_at, generation.last_token_at
        prompt_s = (
            first - generation.admitted_at
            if first is not None and generation.admitted_at is not None
            else 0.0
        )
        predicted_s = last - first if last is not None and first is not None else 0.0
        return Timings(
            cache_n=plan.cached_tokens,
            prompt_n=plan.prompt_tokens - plan.cached_tokens,
            prompt_ms=prompt_s * 1000.0,
            predicted_n=generation.emitted,
            predicted_ms=predicted_s * 1000.0,
        )


def _bearer(request: Request) -> str | None:
    given = request.headers.get("authorization", "")
    return given[7:] if given.startswith("Bearer ") else None


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body), status_code=status, headers=headers, media_type=JSON_TYPE)


def _health_answer(status: int, body: Any) -> Response:
    return Response(status_code=status) if body is None else json_response(body, status)


def _sse(frame: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(frame) + b"\n\n"


async def _hang() -> AsyncGenerator[Part, None]:
    await asyncio.Event().wait()  # never set: the reply cancels this when the client goes away
    yield Abort()


async def _abort() -> AsyncGenerator[Part, None]:
    yield Abort()
