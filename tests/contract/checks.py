"""One function per contract check ``kind``: start the target the way the check needs, ask, assert.

Kinds: boot, health_ready, health_dead, health_switch, metric, cached_tokens, cache_salt,
reasoning_field, context_error, models, stream_error, continue_final_message, continued_as. No check
asserts an upper bound on time; ``min_s`` is a lower bound (a server that by design cannot answer sooner).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.contract.targets import Running, Start

Check = Callable[[Start, dict[str, Any]], None]
HELLO = [{"role": "user", "content": "Say hello in one word."}]
# Long enough to span several prefix-cache blocks, so a repeat of it is served from the cache.
REPEATED = [{"role": "user", "content": " ".join(f"fact{i}" for i in range(120)) + " Summarise."}]

# An answer cut after a few words, to be continued.
SEA = [{"role": "user", "content": "Write one sentence about the sea."}]
REASONING_FIELDS = ("reasoning", "reasoning_content")


def chat(running: Running, messages: list[dict[str, str]], **extra: Any) -> httpx.Response:
    body = {"model": "m", "messages": messages, "max_tokens": 8, **extra}
    return httpx.post(running.url + "/v1/chat/completions", json=body, timeout=120)


def check_boot(start: Start, check: dict[str, Any]) -> None:
    """While loading, /health is refused (vLLM, SGLang) or 503 (llama-server); then 200."""
    with start(cold_boot=True) as running:
        seen: list[int | str] = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                status = httpx.get(running.url + "/health", timeout=5).status_code
            except httpx.ConnectError:
                seen.append("refused")
            else:
                seen.append(status)
                if status == 200:
                    break
            time.sleep(0.01)
        assert seen and seen[-1] == 200, f"never healthy: {seen[-5:]}"
        loading = seen[0]
        if check["while_loading"] != "refused":
            # A real process refuses until it has bound its port at all (a loaded machine makes that
            # window long): the engine's own loading answer is the first one it gives.
            loading = next((answer for answer in seen if answer != "refused"), loading)
        assert loading == check["while_loading"], (
            f"while loading: {loading!r}, then {sorted(set(map(str, seen)))}"
        )


def check_health_ready(start: Start, check: dict[str, Any]) -> None:
    with start() as running:
        began = time.monotonic()
        status = httpx.get(running.url + "/health", timeout=30).status_code
        took = time.monotonic() - began
    assert status == check["status"]
    if "min_s" in check:
        assert took >= check["min_s"], f"answered in {took:.3f}s: no one-token generation behind it"


def check_health_dead(start: Start, check: dict[str, Any]) -> None:
    with start() as running:
        if running.real:
            raise AssertionError("a dead engine is emulated only")
        running.emulator("/emulator/faults", {"engine_dead": True})
        assert httpx.get(running.url + "/health", timeout=10).status_code == check["status"]
        assert chat(running, HELLO).status_code == 500  # every request fails meanwhile


def check_health_switch(start: Start, check: dict[str, Any]) -> None:
    with start(environ=check["env"]) as running:
        assert httpx.get(running.url + "/health", timeout=30).status_code == check["status"]
        assert running.emulator("/emulator/state")["health_generations"] == 0
        # /health_generate still generates.
        assert httpx.get(running.url + "/health_generate", timeout=30).status_code == 200
        assert running.emulator("/emulator/state")["health_generations"] == 1


def check_metric(start: Start, check: dict[str, Any]) -> None:
    with start() as running:
        assert chat(running, HELLO).status_code == 200  # so that every series has been touched
        text = httpx.get(running.url + "/metrics", timeout=10).text
    name = check["name"]
    families = {family.name: family for family in text_string_to_metric_families(text)}
    family = families.get(name) or families.get(name.removesuffix("_total"))
    assert family is not None, f"{name} not on /metrics; found {sorted(families)[:40]}"
    assert family.type == check["type"]
    assert family.samples, f"{name} has no sample"
    for sample in family.samples:
        labels = set(sample.labels) - {"le"}
        assert labels == set(check["labels"]), f"{sample.name}{sample.labels}"


def _cached(usage: dict[str, Any]) -> int | None:
    details = usage.get("prompt_tokens_details")
    return details.get("cached_tokens") if isinstance(details, dict) else None


def check_cached_tokens(start: Start, check: dict[str, Any]) -> None:
    """With the flag (or with none needed) cached tokens are reported, and a repeated prompt has some;
    without the flag prompt_tokens_details is absent or null."""
    flag = check["flag"]
    with start() as running:
        if flag is not None and not running.real:
            # The profile carries the recipe's flags: started without this one, nothing is reported.
            with start(engine_args=()) as bare:
                usage = chat(bare, REPEATED).json()["usage"]
                assert _cached(usage) is None, usage
        first = chat(running, REPEATED).json()["usage"]
        second = chat(running, REPEATED).json()["usage"]
    assert isinstance(_cached(first), int), first
    cached = _cached(second)
    assert isinstance(cached, int) and 0 < cached <= second["prompt_tokens"], second


def check_cache_salt(start: Start, check: dict[str, Any]) -> None:
    """A prompt repeated under its own salt is served from the cache; under another salt (and with
    none) it is too where the engine has no salt (``isolates: false``), and is not where it has one."""
    with start() as running:
        chat(running, REPEATED, cache_salt="tenant-a-salt")
        same = _cached(chat(running, REPEATED, cache_salt="tenant-a-salt").json()["usage"])
        other = _cached(chat(running, REPEATED, cache_salt="tenant-b-salt").json()["usage"])
        refused = chat(running, REPEATED, cache_salt=check["refuses"]) if "refuses" in check else None
    assert isinstance(same, int) and same > 0, same
    if refused is not None:
        assert refused.status_code == 400, refused.text
    if check["isolates"]:
        assert other == 0, other
    else:
        assert isinstance(other, int) and other > 0, other


def check_reasoning_field(start: Start, check: dict[str, Any]) -> None:
    with start() as running:
        whole = chat(running, HELLO, max_tokens=200).json()["choices"][0]["message"]
        body = {"model": "m", "messages": HELLO, "max_tokens": 200, "stream": True}
        with httpx.stream("POST", running.url + "/v1/chat/completions", json=body, timeout=60) as reply:
            text = reply.read().decode()
    assert whole.get(check["message"]), whole
    assert f'"{check["delta"]}":' in text and '"delta":' in text
    other = {"reasoning", "reasoning_content"} - {check["delta"]}
    assert not any(f'"{name}":"' in text for name in other), "thinking under another name too"


def _at(body: dict[str, Any], dotted: str) -> Any:
    value: Any = body
    for key in dotted.split("."):
        value = value[key]
    return value


def check_context_error(start: Start, check: dict[str, Any]) -> None:
    with start(context_tokens=256) as running:
        limit = running.context_tokens or 256
        too_long = [{"role": "user", "content": " ".join(["lorem"] * (limit * 2))}]
        reply = chat(running, too_long)
    assert reply.status_code == check["status"], reply.text
    body = reply.json()
    for dotted, expected in check["fields"].items():
        assert _at(body, dotted) == expected, body
    message = body["error"]["message"] if "error" in body else body["message"]
    assert check["message_contains"] in message, message


def check_models(start: Start, check: dict[str, Any]) -> None:
    with start() as running:
        listed = httpx.get(running.url + "/v1/models", timeout=10).json()
    (model,) = listed["data"]
    assert model["owned_by"] == check["owned_by"]
    assert set(check["fields"]) <= set(model), sorted(model)


def stream(running: Running, body: dict[str, Any]) -> list[Any]:
    """Every ``data:`` payload of a streamed chat answer, JSON-decoded except ``[DONE]``."""
    frames: list[Any] = []
    full = {"model": "m", "stream": True, **body}
    with httpx.stream("POST", running.url + "/v1/chat/completions", json=full, timeout=120) as reply:
        assert reply.status_code == 200, reply.read().decode()
        for line in reply.iter_lines():
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                frames.append(payload if payload == "[DONE]" else json.loads(payload))
    return frames


def _fill(tokens: int) -> list[dict[str, str]]:
    """A prompt of about ``tokens`` tokens (Gemma's tokenizer: about three a word here)."""
    return [{"role": "user", "content": " ".join(f"fact{i}" for i in range(tokens // 3))}]


def check_stream_error(start: Start, check: dict[str, Any]) -> None:
    """An engine error after the stream began: one error event of the engine's shape, then exactly what
    the engine sends after one (``then``: "usage" for a usage chunk, "[DONE]")."""
    engine_args = tuple(check["engine_args"]) if "engine_args" in check else None
    context = 256
    with start(engine_args=engine_args, context_tokens=context) as running:
        if running.real:
            # llama-server: two completions sharing one prompt (n=2) run past the slot's context with
            # context shift on, which it refuses mid-generation (server-context.cpp:2907-2910).
            body = {"messages": _fill(context - 40), "n": 2, "ignore_eos": True, "max_tokens": 4 * context}
        else:
            faults = {"error_after_chunks": 3, "reasoning_tokens": 0, "content_tokens": 10}
            running.emulator("/emulator/faults", faults)
            body = {"messages": HELLO, "max_tokens": 20}
        frames = stream(running, {**body, "stream_options": {"include_usage": True}})
    errors = [i for i, frame in enumerate(frames) if isinstance(frame, dict) and "error" in frame]
    assert len(errors) == 1, frames[-5:]
    (at,) = errors
    assert any(isinstance(f, dict) and f.get("choices") for f in frames[:at]), (
        "the error came before the stream"
    )
    error = frames[at]["error"]
    for key, expected in check["error"].items():
        assert error.get(key) == expected, error
    assert isinstance(error.get("message"), str) and error["message"], error
    after = ["[DONE]" if f == "[DONE]" else "usage" if f.get("usage") else "chunk" for f in frames[at + 1 :]]
    assert after == check["then"], f"after the error event: {after}"


def check_continue_final_message(start: Start, check: dict[str, Any]) -> None:
    """continue_final_message alone (add_generation_prompt left at its default) answers ``alone``;
    with add_generation_prompt false it is a 200 that goes on."""
    cut = [*SEA, {"role": "assistant", "content": "The sea is"}]
    with start() as running:
        alone = chat(running, cut, continue_final_message=True)
        paired = chat(running, cut, continue_final_message=True, add_generation_prompt=False)
    assert alone.status_code == check["alone"], alone.text
    if alone.status_code == 400:
        assert "add_generation_prompt" in alone.text and "continue_final_message" in alone.text, alone.text
    assert paired.status_code == 200, paired.text
    message = paired.json()["choices"][0]["message"]
    assert any(message.get(field) for field in ("content", *REASONING_FIELDS)), message


def _streamed(frames: list[Any], field: str) -> str:
    return "".join(
        str(choice["delta"].get(field) or "")
        for frame in frames
        if isinstance(frame, dict)
        for choice in frame.get("choices") or []
    )


def check_continued_as(start: Start, check: dict[str, Any]) -> None:
    """Each case continues a final assistant message shaped as ``prefix`` (with the ``request`` fields
    the gateway sends this engine); the continued tokens arrive under ``field`` and under no other.
    ``engine_args``: the switches the server needs for it (llama-server: Jinja and a chat template)."""
    engine_args = tuple(check["engine_args"]) if "engine_args" in check else None
    with start(engine_args=engine_args) as running:
        for case in check["cases"]:
            if running.real and case.get("real") == "skip":
                continue
            messages = [*SEA, {"role": "assistant", **case["prefix"]}]
            body = {"messages": messages, "max_tokens": 8, "temperature": 0, **check["request"]}
            if running.real:
                body["ignore_eos"] = True  # a tiny model may end its turn at once: nothing to look at
            frames = stream(running, body)
            fields = {name: _streamed(frames, name) for name in ("content", *REASONING_FIELDS)}
            assert fields[case["field"]].strip(), f"{case['prefix']}: {fields}"
            prefill = str(case["prefix"].get("content") or "")
            assert not prefill or not fields[case["field"]].startswith(prefill), "the prefill came back"
            others = {name: text for name, text in fields.items() if name != case["field"] and text}
            assert not others, f"{case['prefix']}: also under {others}"


CHECKS: dict[str, Check] = {
    "boot": check_boot,
    "health_ready": check_health_ready,
    "health_dead": check_health_dead,
    "health_switch": check_health_switch,
    "metric": check_metric,
    "cached_tokens": check_cached_tokens,
    "cache_salt": check_cache_salt,
    "reasoning_field": check_reasoning_field,
    "context_error": check_context_error,
    "models": check_models,
    "stream_error": check_stream_error,
    "continue_final_message": check_continue_final_message,
    "continued_as": check_continued_as,
}
