"""`gateway check --live POLICY`: what each backend says about itself, asked from where the gateway runs.

Per backend: reachable (and TLS), the model in ``/v1/models``, which load signals answer under which names
(and what routing is blind to without the rest), how its health answers and what that means for its
dialect (docs/contracts), whether usage reports cached tokens, whether it accepts a continuation, and a
one-token request's TTFT. Exit status 1 when a backend a route needs cannot take a request now.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Any, TextIO

import httpx
import orjson

from gateway.backends.base import Fetched
from gateway.backends.continuation import continuation_body
from gateway.measure.boot import read_health
from gateway.policy.compiled import CompiledBackend, CompiledPolicy
from gateway.values.dialect import REASONING_FIELDS

# (metric names tried in order, what routing reads from it) per dialect (docs/contracts/*.yaml, metrics).
LOAD_SIGNALS: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "vllm": [
        (("vllm:num_requests_running",), "running requests"),
        (("vllm:num_requests_waiting",), "queue depth (TTFT predicted before sending)"),
        (("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), "KV-cache pressure"),
        (("vllm:generation_tokens_total",), "the pool's throughput (its GPU-hour cost per token)"),
    ],
    "sglang": [
        (("sglang:num_running_reqs",), "running requests"),
        (("sglang:num_queue_reqs",), "queue depth (TTFT predicted before sending)"),
        (("sglang:token_usage",), "KV-cache pressure"),
        (("sglang:gen_throughput",), "the pool's throughput (its GPU-hour cost per token)"),
    ],
    "llamacpp": [
        (("llamacpp:requests_processing",), "running requests"),
        (("llamacpp:requests_deferred",), "queue depth (TTFT predicted before sending)"),
        (("llamacpp:tokens_predicted_total",), "the pool's throughput (its GPU-hour cost per token)"),
    ],
}
# The flag that turns cached-token reporting on (docs/contracts: usage.cached_tokens_flag).
CACHED_TOKENS_FLAG = {"vllm": "--enable-prompt-tokens-details", "sglang": "--enable-cache-report"}
PROMPT = [{"role": "user", "content": "Say OK."}]
PARTIAL_ANSWER = "The colour is"
PARTIAL_THINKING = "One colour, in a word."  # the thinking a cut answer came after


@dataclass
class BackendReport:
    name: str
    dialect: str
    needed: bool  # some route lists it
    reach: str = ""
    model: str = ""
    health: str = ""
    signals: str = ""
    cached: str = ""
    continuation: str = ""
    ttft: str = ""
    problems: list[str] = field(default_factory=list)  # what makes it unusable now
    notes: list[str] = field(default_factory=list)  # what it works without

    @property
    def usable(self) -> bool:
        return not self.problems


async def probe_backend(client: httpx.AsyncClient, backend: CompiledBackend, needed: bool) -> BackendReport:
    report = BackendReport(backend.name, backend.dialect, needed)
    if backend.dialect not in ("vllm", "sglang", "llamacpp", "openai"):
        report.reach = "not probed"
        report.notes.append(f"{backend.dialect} is reached through litellm; nothing probed")
        return report
    headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
    if not await _reach(client, backend, headers, report):
        return report
    await _health(client, backend, headers, report)
    await _signals(client, backend, headers, report)
    await _one_token(client, backend, headers, report)
    await _continuation(client, backend, headers, report)
    return report


async def _reach(
    client: httpx.AsyncClient, backend: CompiledBackend, headers: dict[str, str], report: BackendReport
) -> bool:
    tls = backend.base_url.startswith("https://")
    try:
        reply = await client.get(backend.base_url + "/models", headers=headers, timeout=10)
    except httpx.ConnectError as exc:
        text = str(exc) or type(exc).__name__
        report.reach = "TLS failed" if tls and ("SSL" in text or "certificate" in text) else "refused"
        report.problems.append(f"cannot connect: {text}")
        return False
    except httpx.HTTPError as exc:
        report.reach = "no answer"
        report.problems.append(f"GET /models: {type(exc).__name__}: {exc}")
        return False
    report.reach = "ok, TLS ok" if tls else "ok"
    if reply.status_code != 200:
        report.model = f"HTTP {reply.status_code}"
        report.problems.append(f"GET /models answered HTTP {reply.status_code}")
        return True
    listed = [m.get("id") for m in _json(reply).get("data", []) if isinstance(m, dict)]
    names = ", ".join(map(str, listed)) or "nothing"
    if backend.model in listed:
        report.model = "listed"
    elif backend.dialect == "llamacpp":
        # One model per llama-server, served whatever "model" a request names (it echoes the name back:
        # llama.cpp/tools/server/server-common.cpp:1487).
        report.model = "not listed"
        report.notes.append(
            f"/models lists {names}, not {backend.model} (llama-server serves it under any name)"
        )
    else:
        report.model = "NOT listed"
        report.problems.append(f"/models lists {names}, not {backend.model}")
    return True


async def _health(
    client: httpx.AsyncClient, backend: CompiledBackend, headers: dict[str, str], report: BackendReport
) -> None:
    url = backend.signals.health_url
    if url is None:
        report.health = "not configured"
        report.notes.append("no health_url: a dead backend is found by failing requests only")
        return
    began = time.monotonic()
    try:
        reply = await client.get(url, headers=headers, timeout=backend.signals.health_timeout_s)
        fetched = Fetched(reply.status_code)
    except httpx.ConnectError:
        fetched = Fetched(None, error="ConnectError: cannot connect")
    except httpx.HTTPError as exc:
        fetched = Fetched(
            None, error=f"{type(exc).__name__}: no answer in {backend.signals.health_timeout_s:g}s"
        )
    took = time.monotonic() - began
    reading = read_health(
        backend.dialect,
        fetched,
        ready_once=False,
        waited_s=0.0,
        expected_boot_s=backend.signals.expected_boot_s,
    )
    answer = f"HTTP {fetched.status}" if fetched.status is not None else fetched.error
    report.health = f"{answer} in {took:.2f}s: {reading.why}"
    if not reading.healthy:
        report.problems.append(f"health: {reading.why}")


async def _signals(
    client: httpx.AsyncClient, backend: CompiledBackend, headers: dict[str, str], report: BackendReport
) -> None:
    known = LOAD_SIGNALS.get(backend.dialect, [])
    url = backend.signals.metrics_url
    found: list[str] = []
    text = ""
    if url is not None:
        try:
            reply = await client.get(url, headers=headers, timeout=10)
        except httpx.HTTPError as exc:
            report.notes.append(f"metrics_url: {type(exc).__name__}")
        else:
            if reply.status_code == 200:
                text = reply.text
            else:
                report.notes.append(f"metrics_url answered HTTP {reply.status_code}")
    for names, _ in known:
        name = next((n for n in names if re.search(rf"^{re.escape(n)}[{{ ]", text, re.MULTILINE)), None)
        if name is not None:
            found.append(name)
    if backend.signals.slots_url is not None:
        try:
            slots = await client.get(backend.signals.slots_url, headers=headers, timeout=10)
            if slots.status_code == 200:
                found.append("/slots")
        except httpx.HTTPError:
            pass
    missing = [what for names, what in known if not any(n in found for n in names)]
    report.signals = ", ".join(found) if found else "none"
    if missing:
        report.notes.append("routing is blind to " + "; ".join(missing))
    elif not known and url is None:
        report.notes.append("no load signals: routing predicts from its own measurements only")


async def _one_token(
    client: httpx.AsyncClient, backend: CompiledBackend, headers: dict[str, str], report: BackendReport
) -> None:
    body = {"model": backend.model, "messages": PROMPT, "max_tokens": 1, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    began = time.monotonic()
    first: float | None = None
    usage: dict[str, Any] | None = None
    timeout = httpx.Timeout(backend.timeouts.first_byte_s, connect=backend.timeouts.connect_s)
    try:
        async with client.stream(
            "POST", backend.base_url + "/chat/completions", json=body, headers=headers, timeout=timeout
        ) as reply:
            if reply.status_code != 200:
                detail = (await reply.aread()).decode(errors="replace")[:200]
                report.ttft = f"HTTP {reply.status_code}"
                report.problems.append(f"a one-token request answered HTTP {reply.status_code}: {detail}")
                return
            async for line in reply.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = orjson.loads(line[6:])
                if first is None and event.get("choices"):
                    first = time.monotonic()
                if isinstance(event.get("usage"), dict):
                    usage = event["usage"]
    except (httpx.HTTPError, orjson.JSONDecodeError) as exc:
        report.ttft = "failed"
        report.problems.append(f"a one-token request failed: {type(exc).__name__}: {exc}")
        return
    report.ttft = f"{first - began:.2f}s" if first is not None else "no token"
    _note_cached(backend, usage, report)


def _note_cached(backend: CompiledBackend, usage: dict[str, Any] | None, report: BackendReport) -> None:
    if usage is None:
        report.cached = "unknown (no usage)"
        return
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        report.cached = "on"
        return
    flag = CACHED_TOKENS_FLAG.get(backend.dialect)
    report.cached = "off"
    hint = f": start it with {flag}" if flag else ""
    report.notes.append(f"cached tokens not reported, so every prompt token is priced as prefill{hint}")


async def _continuation(
    client: httpx.AsyncClient, backend: CompiledBackend, headers: dict[str, str], report: BackendReport
) -> None:
    """Two tokens after a cut answer, asked exactly as the gateway asks this backend to go on from one
    (``backends.continuation``: the answer so far, the thinking before it, streamed), so the field
    they come back in is the one a resumed stream would meet. A backend whose policy says ``resume: none``
    is asked its dialect's way (a paid API: ``partial``), to say whether turning resume on would work."""
    style = backend.resume
    if style == "none":
        style = "partial" if backend.dialect == "openai" else "continue_final_message"
    payload = {"model": backend.model, "messages": [{"role": "user", "content": "Name a colour."}]}
    asked = replace(backend, resume=style)
    body = continuation_body(payload, asked, PARTIAL_ANSWER, PARTIAL_THINKING, 2, 0)
    fields: dict[str, str] = {}
    try:
        async with client.stream(
            "POST",
            backend.base_url + "/chat/completions",
            content=body,
            headers={**headers, "content-type": "application/json"},
            timeout=backend.timeouts.first_byte_s,
        ) as reply:
            if reply.status_code != 200:
                await reply.aread()
                report.continuation = f"rejected (HTTP {reply.status_code})"
            else:
                async for line in reply.aiter_lines():
                    _collect_delta(line, fields)
    except httpx.HTTPError as exc:
        report.continuation = f"failed ({type(exc).__name__})"
        return
    if not report.continuation:
        thinking = next((name for name in REASONING_FIELDS if fields.get(name)), None)
        if fields.get("content"):
            report.continuation = "accepted, as content"
        elif thinking is not None:
            # The gateway relays it as content once the transcript says the answer had begun
            # (request/resume.py), so this is no defect; it says the engine's parser still thinks.
            report.continuation = f"accepted, as {thinking} (relayed as content)"
        else:
            report.continuation = "accepted, nothing came"
    report.continuation += f"; policy resume: {backend.resume}"


def _collect_delta(line: str, fields: dict[str, str]) -> None:
    """Adds one SSE line's delta text to ``fields``, by field name."""
    if not line.startswith("data: ") or line == "data: [DONE]":
        return
    try:
        frame = orjson.loads(line[6:])
    except orjson.JSONDecodeError:
        return
    for choice in (frame.get("choices") if isinstance(frame, dict) else None) or []:
        delta = choice.get("delta") if isinstance(choice, dict) else None
        for name, text in (delta or {}).items():
            if name in ("content", *REASONING_FIELDS) and isinstance(text, str):
                fields[name] = fields.get(name, "") + text


def _json(reply: httpx.Response) -> dict[str, Any]:
    try:
        body = reply.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def probe_policy(policy: CompiledPolicy) -> list[BackendReport]:
    needed = {name for route in policy.routes.values() for name in route.backends}
    async with httpx.AsyncClient() as client:
        return list(
            await asyncio.gather(
                *(probe_backend(client, backend, name in needed) for name, backend in policy.backends.items())
            )
        )


def render(reports: list[BackendReport], out: TextIO) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="gateway check --live", show_lines=True)
    for column in (
        "backend",
        "reach",
        "model",
        "health",
        "load signals",
        "cached tokens",
        "continuation",
        "TTFT",
    ):
        table.add_column(column, overflow="fold")
    for r in reports:
        name = f"{r.name}\n({r.dialect})" + ("" if r.usable else "\nUNUSABLE")
        table.add_row(name, r.reach, r.model, r.health, r.signals, r.cached, r.continuation, r.ttft)
    console = Console(file=out, width=160, highlight=False, soft_wrap=False)
    console.print(table)
    for r in reports:
        for problem in r.problems:
            console.print(f"{r.name}: UNUSABLE: {problem}", markup=False)
        for note in r.notes:
            console.print(f"{r.name}: {note}", markup=False)


def live_check(policy: CompiledPolicy, out: TextIO = sys.stdout) -> int:
    reports = asyncio.run(probe_policy(policy))
    render(reports, out)
    unusable = [r.name for r in reports if r.needed and not r.usable]
    if unusable:
        print(f"unusable backends a route needs: {', '.join(unusable)}", file=out)
        return 1
    return 0
