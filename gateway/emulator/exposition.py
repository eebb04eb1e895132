"""Load signals as each dialect exposes them: Prometheus text for ``/metrics`` and llama.cpp's ``/slots``.

Hand-written in the shape each server prints, so scrapers meet the names, types and labels of production.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from gateway.emulator.engine import Engine

Sample = tuple[str, dict[str, str], float]  # (name suffix, labels, value)


def metrics_text(engine: Engine) -> str:
    dialect = engine.profile.dialect
    if dialect == "vllm":
        return _vllm_metrics(engine)
    if dialect == "llamacpp":
        return _llamacpp_metrics(engine)
    if dialect == "sglang":
        return _sglang_metrics(engine)
    return _paid_metrics(engine)


def slots_json(engine: Engine) -> list[dict[str, Any]]:
    """llama-server's /slots: one object per slot, with the current or previous task's progress."""
    slots: list[dict[str, Any]] = []
    for seat, (current, previous) in enumerate(engine.seats()):
        slot: dict[str, Any] = {
            "id": seat,
            "n_ctx": engine.profile.context_tokens,
            "speculative": False,
            "is_processing": current is not None,
        }
        task = current or previous
        if task is None:  # a slot that never served: only these four fields, as the real server says
            slots.append(slot)
            continue
        plan = task.plan
        slot.update(
            id_task=task.task_id,
            n_prompt_tokens=plan.prompt_tokens,
            n_prompt_tokens_processed=plan.prompt_tokens - plan.cached_tokens,
            n_prompt_tokens_cache=plan.cached_tokens,
            params={"n_predict": plan.total_tokens, "stream": True},
            next_token=[
                {
                    "has_next_token": current is not None and task.emitted < plan.total_tokens,
                    "has_new_line": False,
                    "n_remain": plan.total_tokens - task.emitted,
                    "n_decoded": task.emitted,
                }
            ],
        )
        slots.append(slot)
    return slots


def _ttft_buckets(engine: Engine, labels: dict[str, str]) -> list[Sample]:
    ttft = engine.totals.ttft
    buckets: list[Sample] = [
        ("_bucket", {**labels, "le": _number(bound)}, float(count))
        for bound, count in zip(ttft.bounds, ttft.cumulative(), strict=True)
    ]
    buckets.append(("_bucket", {**labels, "le": "+Inf"}, float(ttft.count)))
    return [*buckets, ("_count", labels, float(ttft.count)), ("_sum", labels, ttft.total)]


def _kv_usage(engine: Engine) -> float:
    capacity = engine.profile.kv_capacity_tokens
    return min(1.0, engine.kv_tokens() / capacity) if capacity else 0.0


def _sglang_metrics(engine: Engine) -> str:
    # The scheduler's labels (metrics_collector.py:1382-1392): one TP=8 server is the tp_rank 0 series.
    labels = {"model_name": engine.profile.model, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
              "moe_ep_rank": "0"}  # fmt: skip
    # The TTFT histogram is the tokenizer manager's (metrics_collector.py:1805-1812, 2041-2048).
    ttft_labels = {"model_name": engine.profile.model, "engine_type": "unified", "is_streaming": "true"}
    totals = engine.totals
    throughput = engine.running * engine.per_stream_tokens_per_s()
    return "".join(
        [
            _family("sglang:num_running_reqs", "gauge", "The number of running requests.",
                    [("", labels, engine.running)]),
            _family("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
                    [("", labels, engine.waiting)]),
            _family("sglang:token_usage", "gauge", "The token usage.", [("", labels, _kv_usage(engine))]),
            _family("sglang:gen_throughput", "gauge", "The generation throughput (token/s).",
                    [("", labels, throughput)]),
            _family("sglang:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                    [("", labels, totals.prompt_tokens)]),
            _family("sglang:generation_tokens_total", "counter", "Number of generation tokens processed.",
                    [("", labels, totals.generation_tokens)]),
            _family("sglang:time_to_first_token_seconds", "histogram",
                    "Histogram of time to first token in seconds.", _ttft_buckets(engine, ttft_labels)),
        ]
    )  # fmt: skip


def _vllm_metrics(engine: Engine) -> str:
    labels = {"engine": "0", "model_name": engine.profile.model}
    totals = engine.totals
    kv_usage = _kv_usage(engine)
    buckets = _ttft_buckets(engine, labels)
    return "".join(
        [
            _family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                    [("", labels, engine.running)]),
            _family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                    [("", labels, engine.waiting)]),
            _family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                    [("", labels, kv_usage)]),
            _family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                    [("", labels, totals.prompt_tokens)]),
            _family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                    [("", labels, totals.generation_tokens)]),
            _family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                    [("", {**labels, "finished_reason": reason}, totals.completed if reason == "stop" else 0)
                     for reason in ("stop", "length", "abort", "error", "repetition")]),
            _family("vllm:time_to_first_token_seconds", "histogram",
                    "Histogram of time to first token in seconds.", buckets),
        ]
    )  # fmt: skip


def _llamacpp_metrics(engine: Engine) -> str:
    totals = engine.totals
    prompt_bucket, generation_bucket = engine.take_throughput_buckets()
    # The names, order and help texts of tools/server/server-task.cpp (to_metrics) in the llama.cpp that
    # llama-cpp-python 0.3.36 vendors, checked against the real server by tests/real; it has no KV-cache
    # gauge any more (older builds had llamacpp:kv_cache_usage_ratio, which the gateway still reads).
    counters = [
        ("prompt_tokens_total", "Number of prompt tokens processed, excluding cached tokens",
         totals.prompt_tokens - totals.cached_prompt_tokens),
        ("prompt_tokens_cached_total", "Number of prompt tokens reused from the cache",
         totals.cached_prompt_tokens),
        ("prompt_seconds_total", "Total time spent processing prompts", totals.prompt_seconds),
        ("tokens_predicted_total", "Number of generation tokens processed", totals.generation_tokens),
        ("tokens_predicted_seconds_total", "Total time spent generating tokens", totals.generation_seconds),
    ]  # fmt: skip
    gauges = [
        ("prompt_tokens_seconds", "Average prompt throughput in tokens/s", prompt_bucket.per_second()),
        (
            "predicted_tokens_seconds",
            "Average generation throughput in tokens/s",
            generation_bucket.per_second(),
        ),
        ("requests_processing", "Number of requests processing", engine.running),
        ("requests_deferred", "Number of requests deferred", engine.waiting),
    ]
    # llama-server prints values through a C++ stream: six significant digits, no trailing ".0".
    lines = [
        _family("llamacpp:" + name, "counter", text, [("", {}, value)], _cpp)
        for name, text, value in counters
    ]
    lines += [
        _family("llamacpp:" + name, "gauge", text, [("", {}, value)], _cpp) for name, text, value in gauges
    ]
    return "".join(lines)


def _paid_metrics(engine: Engine) -> str:
    # Paid APIs expose no metrics; these describe the emulator itself, for demos and debugging.
    totals = engine.totals
    return "".join(
        [
            _family("emulator:requests_running", "gauge", "Requests being answered.",
                    [("", {}, engine.running)]),
            _family("emulator:requests_total", "counter", "Requests accepted.", [("", {}, totals.requests)]),
            _family("emulator:prompt_tokens_total", "counter", "Prompt tokens received.",
                    [("", {}, totals.prompt_tokens)]),
            _family("emulator:generation_tokens_total", "counter", "Tokens generated.",
                    [("", {}, totals.generation_tokens)]),
        ]
    )  # fmt: skip


def _family(name: str, kind: str, help_text: str, samples: Iterable[Sample], fmt: Any = None) -> str:
    render = fmt or _number
    lines = [f"# HELP {name} {help_text}\n", f"# TYPE {name} {kind}\n"]
    for suffix, labels, value in samples:
        lines.append(f"{name}{suffix}{_labels(labels)} {render(value)}\n")
    return "".join(lines)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    pairs = (f'{key}="{_escape(value)}"' for key, value in sorted(labels.items()))
    return "{" + ",".join(pairs) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    value = float(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(value)


def _cpp(value: float) -> str:
    return f"{float(value):.6g}"
