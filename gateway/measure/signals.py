"""Load signals that backends report about themselves, and the parsers of the three engines' pages.

vLLM, SGLang and llama.cpp expose queue depth, running requests and KV-cache use (llama.cpp's slots
too); the decision uses them to predict TTFT before sending. Reading the pages off the request path,
with the health checks, is ``scraper.py``'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True, slots=True)
class LoadSignals:
    scraped_at: float  # clock seconds
    running: float | None = None  # decoding now (vllm:num_requests_running, llamacpp:requests_processing)
    waiting: float | None = None  # requests queued (vllm:num_requests_waiting, llamacpp:requests_deferred)
    kv_cache_usage: float | None = None  # 0..1
    generation_tokens_total: float | None = None  # monotonic counter, for the pool's own throughput
    generation_tokens_per_s: float | None = None  # rate of that counter between the last two scrapes
    slots_total: int | None = None  # llama.cpp parallel slots
    slots_busy: int | None = None
    ttft_mean_s: float | None = None  # the server's own time-to-first-token histogram, mean since start


# Metric stems each parser reads; vLLM's page is mostly histograms, so only these lines are parsed.
_VLLM_STEMS = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
    "vllm:generation_tokens",
)
_LLAMACPP_STEMS = (
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "llamacpp:kv_cache_usage_ratio",
    "llamacpp:tokens_predicted",
)

_SGLANG_STEMS = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:token_usage",
    "sglang:gen_throughput",
    "sglang:time_to_first_token_seconds_sum",
    "sglang:time_to_first_token_seconds_count",
)


# The ranks of one SGLang scheduler group: they run the same batch, so they report the same counts.
_SGLANG_GROUP_RANKS = frozenset({"tp_rank", "pp_rank", "moe_ep_rank"})


def parse_vllm_metrics(text: str, scraped_at: float, previous: LoadSignals | None) -> LoadSignals:
    """Reads vLLM's ``/metrics``; counts are summed over label sets (model_name, engine).

    The KV-cache share is averaged instead: each data-parallel engine has its own cache.
    """
    samples = _finite_samples(text, _VLLM_STEMS)
    kv = _share(samples, "vllm:kv_cache_usage_perc")
    if kv is None:
        kv = _share(samples, "vllm:gpu_cache_usage_perc")  # the name older vLLM releases use
    return _load_signals(
        scraped_at,
        previous,
        running=_sum(samples, "vllm:num_requests_running"),
        waiting=_sum(samples, "vllm:num_requests_waiting"),
        kv_cache_usage=kv,
        generation_tokens_total=_sum(samples, "vllm:generation_tokens_total"),
    )


def parse_llamacpp_metrics(text: str, scraped_at: float, previous: LoadSignals | None) -> LoadSignals:
    """Reads ``llama-server --metrics``; the KV-cache ratio only exists in older builds.

    llama-server adds a request's tokens to ``llamacpp:tokens_predicted_total`` when the request ends,
    so the rate between two scrapes is lumpy: zero while long streams decode, a jump when they finish;
    right over minutes, not per scrape. ``llamacpp:predicted_tokens_seconds`` is no better a substitute:
    it is the per-stream speed of the requests finished since the previous scrape (each scrape resets it).
    """
    samples = _finite_samples(text, _LLAMACPP_STEMS)
    return _load_signals(
        scraped_at,
        previous,
        running=_sum(samples, "llamacpp:requests_processing"),
        waiting=_sum(samples, "llamacpp:requests_deferred"),
        kv_cache_usage=_share(samples, "llamacpp:kv_cache_usage_ratio"),
        generation_tokens_total=_sum(samples, "llamacpp:tokens_predicted_total"),
    )


def parse_sglang_metrics(text: str, scraped_at: float, previous: LoadSignals | None) -> LoadSignals:
    """Reads SGLang's ``/metrics`` (``--enable-metrics``): its throughput is a gauge it computes itself,
    its KV-cache share is ``token_usage``; counts are summed over data-parallel ranks. Ranks of one
    scheduler group (tp_rank, pp_rank, moe_ep_rank) hold the same batch and, with
    --enable-metrics-for-all-schedulers, all report it: one of them counts (docs/contracts/sglang.yaml,
    metrics.scheduler_labels)."""
    samples = _finite_samples(text, _SGLANG_STEMS, same_group=_SGLANG_GROUP_RANKS)
    count = _sum(samples, "sglang:time_to_first_token_seconds_count")
    ttft_sum = _sum(samples, "sglang:time_to_first_token_seconds_sum")
    return LoadSignals(
        scraped_at=scraped_at,
        running=_sum(samples, "sglang:num_running_reqs"),
        waiting=_sum(samples, "sglang:num_queue_reqs"),
        kv_cache_usage=_share(samples, "sglang:token_usage"),
        generation_tokens_per_s=_sum(samples, "sglang:gen_throughput"),
        ttft_mean_s=ttft_sum / count if count and ttft_sum is not None else None,
    )


def parse_llamacpp_slots(payload: object) -> tuple[int, int]:
    """``(total, busy)`` from llama.cpp's ``/slots`` list, newer (``is_processing``) or older (``state``)."""
    if not isinstance(payload, list):
        raise ValueError("/slots did not answer a JSON list")
    busy = 0
    for slot in payload:
        if not isinstance(slot, dict):
            raise ValueError("a /slots entry is not an object")
        if "is_processing" in slot:
            busy += bool(slot["is_processing"])
        elif "state" in slot:
            busy += slot["state"] != 0  # 0 is idle; forks number several busy states
        else:
            raise ValueError("a /slots entry has neither is_processing nor state")
    return len(payload), busy


def _finite_samples(
    text: str, stems: tuple[str, ...], same_group: frozenset[str] = frozenset()
) -> dict[str, list[float]]:
    """Finite values per sample name, one per label set; label sets that differ only in the
    ``same_group`` labels are copies of one reading, and the largest stands for them."""
    wanted = "\n".join(line for line in text.splitlines() if any(stem in line for stem in stems))
    grouped: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for family in text_string_to_metric_families(wanted):
        for sample in family.samples:
            if math.isfinite(sample.value):
                key = (
                    sample.name,
                    frozenset((k, v) for k, v in sample.labels.items() if k not in same_group),
                )
                grouped[key] = max(grouped.get(key, -math.inf), float(sample.value))
    found: dict[str, list[float]] = {}
    for (name, _), value in grouped.items():
        found.setdefault(name, []).append(value)
    return found


def _sum(samples: dict[str, list[float]], name: str) -> float | None:
    values = samples.get(name)
    return math.fsum(values) if values else None


def _share(samples: dict[str, list[float]], name: str) -> float | None:
    """The mean over label sets of a 0..1 gauge, clamped to 0..1."""
    values = samples.get(name)
    return min(max(math.fsum(values) / len(values), 0.0), 1.0) if values else None


def _load_signals(
    scraped_at: float,
    previous: LoadSignals | None,
    *,
    running: float | None,
    waiting: float | None,
    kv_cache_usage: float | None,
    generation_tokens_total: float | None,
) -> LoadSignals:
    return LoadSignals(
        scraped_at=scraped_at,
        running=running,
        waiting=waiting,
        kv_cache_usage=kv_cache_usage,
        generation_tokens_total=generation_tokens_total,
        generation_tokens_per_s=_token_rate(generation_tokens_total, scraped_at, previous),
    )


def _token_rate(total: float | None, scraped_at: float, previous: LoadSignals | None) -> float | None:
    if total is None or previous is None or previous.generation_tokens_total is None:
        return None
    elapsed = scraped_at - previous.scraped_at
    if elapsed <= 0:
        return None
    increase = total - previous.generation_tokens_total
    if increase < 0:  # the server restarted and its counter with it: all it counted since is new
        increase = total
    return increase / elapsed


def parse_metrics(dialect: str, text: str, now: float, previous: LoadSignals | None) -> LoadSignals:
    """A metrics page read in ``dialect`` (sniffed where the dialect has none of its own); ValueError
    when it names no known load metric."""
    if dialect == "sglang" or (dialect == "openai" and "sglang:" in text):
        load = parse_sglang_metrics(text, now, previous)
        if (load.running, load.waiting, load.kv_cache_usage) == (None,) * 3:
            raise ValueError("no known load metric in the answer")
        return load
    # Dialects without load metrics of their own (a plain OpenAI-compatible server) are sniffed.
    llamacpp = dialect == "llamacpp" or (dialect != "vllm" and "llamacpp:" in text)
    load = (parse_llamacpp_metrics if llamacpp else parse_vllm_metrics)(text, now, previous)
    if (load.running, load.waiting, load.kv_cache_usage, load.generation_tokens_total) == (None,) * 4:
        raise ValueError("no known load metric in the answer")
    return load
