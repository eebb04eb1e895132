"""The measurements taken for each way of reaching the upstream (direct, ours, LiteLLM), in one order:
startup, idle memory, c=1 latency, saturation, a fixed open-loop rate, a long memory run, paced streams."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench.loadgen import Client, Result, Target, closed_loop, connect, open_loop, percentile
from bench.procs import CpuWindow, Proc, RssSampler

MB = 1024 * 1024
STREAM_S = 0.1 + 63 / 50.0  # one paced stream: first token at 100 ms, 63 more at 50 tokens/s


@dataclass(frozen=True)
class Settings:
    quick: bool
    c1_s: float
    saturation_s: float
    warmup_s: float
    rate: float
    rate_s: float
    memory_requests: int
    memory_max_s: float  # LiteLLM's long run is cut to about this many seconds
    paced_steps: tuple[int, ...]
    paced_window_s: float
    paced_refine: int  # bisection steps between the last step that held and the first that did not
    concurrency: int = 64

    @classmethod
    def make(cls, quick: bool, memory_requests: int | None) -> Settings:
        if quick:
            return cls(
                True, 2.0, 3.0, 0.5, 200.0, 3.0, memory_requests or 10_000, 10.0, (16, 64, 256), 2.5, 1
            )
        steps = (16, 32, 64, 128, 256, 512, 1024)
        return cls(False, 4.0, 6.0, 1.0, 200.0, 6.0, memory_requests or 100_000, 20.0, steps, 4.0, 2)


Say = Callable[[str], None]


@dataclass
class Way:
    """One way to reach the upstream: its name, port, model names and the process doing the work."""

    name: str
    port: int
    proc: Proc
    fast_model: str
    paced_model: str
    api_key: str
    upstream: Proc | None = None  # its CPU is the harness's, when telling other people's load apart

    def cpu_window(self) -> CpuWindow:
        """Going direct, the measured process is the upstream itself, on the load generator's core."""
        if self.name == "direct":
            return CpuWindow(self.proc, core=1, upstream=self.proc)
        return CpuWindow(self.proc, core=0, upstream=self.upstream)

    def target(self, stream: bool, paced: bool = False) -> Target:
        model = self.paced_model if paced else self.fast_model
        return Target("127.0.0.1", self.port, model, stream, api_key=self.api_key)


def ms(value: float | None) -> float | None:
    return None if value is None else value * 1000.0


def latency_summary(r: Result) -> dict[str, Any]:
    return {
        "ok": r.ok,
        "errors": r.errors,
        "error_kinds": r.error_kinds,
        "rps": r.rps,
        "p50_ms": ms(percentile(r.latencies, 0.5)),
        "p99_ms": ms(percentile(r.latencies, 0.99)),
        "ttft_p50_ms": ms(percentile(r.ttfts, 0.5)),
        "ttft_p99_ms": ms(percentile(r.ttfts, 0.99)),
    }


async def wait_ready(way: Way, timeout_s: float) -> float | None:
    """Seconds from spawning the process to its first successful chat completion."""
    raw = way.target(False).request_bytes()
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline and way.proc.alive():
        client: Client | None = None
        try:
            client = await connect(way.target(False), False)
            sample = await asyncio.wait_for(client.request(raw, time.perf_counter()), 5.0)
            if sample.status == 200:
                return sample.done - way.proc.started
        except (OSError, TimeoutError, Exception):
            pass
        finally:
            if client is not None:
                client.close()
        await asyncio.sleep(0.02)
    return None


def foreign_shares(way: Way, window: CpuWindow) -> dict[str, float | None]:
    """Other processes' share of the proxy's core (none going direct) and of the load generator's core."""
    return {
        "core_foreign_share": None if way.name == "direct" else window.foreign_share,
        "load_core_foreign_share": window.load_core_foreign_share,
    }


async def at_c1(way: Way, s: Settings, stream: bool) -> dict[str, Any]:
    window = way.cpu_window()
    r = await closed_loop(way.target(stream), 1, s.c1_s, warmup_s=s.warmup_s, on_window=window)
    return {**latency_summary(r), **foreign_shares(way, window)}


async def saturation(way: Way, s: Settings, stream: bool) -> dict[str, Any]:
    window = way.cpu_window()
    r = await closed_loop(
        way.target(stream), s.concurrency, s.saturation_s, warmup_s=s.warmup_s, on_window=window
    )
    out = latency_summary(r)
    out["cpu_s"] = window.cpu_s
    out.update(foreign_shares(way, window))
    if r.ok:
        if stream:
            out["cpu_ms_per_stream"] = window.cpu_s / r.ok * 1000.0
            out["cpu_us_per_chunk"] = window.cpu_s / max(r.events, 1) * 1e6
            out["events_per_stream"] = r.events / r.ok
        else:
            out["cpu_ms_per_req"] = window.cpu_s / r.ok * 1000.0
    return out


def moderate_rate(s: Settings, saturated_rps: float) -> float:
    """The fixed rate, or half of what this proxy can do if that is lower (rounded to 5 req/s)."""
    if saturated_rps >= 2 * s.rate:
        return s.rate
    return max(5.0, 5.0 * int(saturated_rps / 2 / 5))


async def at_rate(way: Way, rate: float, s: Settings) -> dict[str, Any]:
    r = await open_loop(way.target(False), rate, s.rate_s)
    return {"rate": rate, **latency_summary(r)}


async def memory_run(way: Way, s: Settings, saturated_rps: float, say: Say) -> dict[str, Any]:
    n = s.memory_requests
    if way.name == "litellm":
        n = min(n, max(200, int(saturated_rps * s.memory_max_s)))
    before = way.proc.rss_bytes()
    say(f"{way.name}: memory run, {n:,} non-streaming requests at c={s.concurrency}")
    r = await closed_loop(way.target(False), s.concurrency, 600.0, total=n)
    await asyncio.sleep(1.0)
    return {
        "n_requests": r.ok,
        "n_errors": r.errors,
        "rss_before_n_mb": before / MB,
        "rss_after_n_mb": way.proc.rss_bytes() / MB,
    }


async def paced_step(way: Way, c: int, s: Settings) -> dict[str, Any]:
    window = way.cpu_window()
    r = await closed_loop(
        way.target(True, paced=True),
        c,
        s.paced_window_s,
        warmup_s=2 * STREAM_S,  # every connection has finished its first (connection-opening) stream
        record_gaps=True,
        stagger_s=STREAM_S,
        grace_s=5.0,
        on_window=window,
    )
    return {
        "concurrency": c,
        "streams_per_s": r.rps,
        "ok": r.ok,
        "errors": r.errors,
        "ttft_p50_ms": ms(percentile(r.ttfts, 0.5)),
        "ttft_p99_ms": ms(percentile(r.ttfts, 0.99)),
        "gap_p50_ms": ms(percentile(r.gaps, 0.5)),
        "gap_p99_ms": ms(percentile(r.gaps, 0.99)),
        "cpu_share": window.cpu_s / s.paced_window_s,  # of the proxy's core (going direct: the upstream)
        "cpu_us_per_chunk": window.cpu_s / r.events * 1e6 if r.events else None,
    }


def holds(step: dict[str, Any], baseline: dict[str, Any]) -> bool:
    """A step holds when TTFT p99 and gap p99 stay within twice the upstream's own (direct, lowest step)."""
    if step["errors"] or not step["ok"] or step["ttft_p99_ms"] is None or step["gap_p99_ms"] is None:
        return False
    return bool(
        step["ttft_p99_ms"] <= 2 * baseline["ttft_p99_ms"]
        and step["gap_p99_ms"] <= 2 * baseline["gap_p99_ms"]
    )


async def paced(
    way: Way, s: Settings, baseline: dict[str, Any] | None, limit: int | None, say: Say
) -> dict[str, Any]:
    """Double the concurrent paced streams until a step does not hold (halving below the first step if
    that one fails), then bisect between the last step that held and the first that did not.

    ``limit``: the highest step going direct held at; beyond it the harness, not the proxy, is the limit,
    so it is the last step tried.
    """
    steps: dict[int, dict[str, Any]] = {}

    async def probe(c: int) -> bool:
        nonlocal baseline
        step = await paced_step(way, c, s)
        if baseline is None:
            baseline = step
        step["passed"] = holds(step, baseline)
        steps[c] = step
        say(
            f"{way.name}: {c} paced streams: TTFT p99 {step['ttft_p99_ms'] or 0:.1f} ms, "
            f"gap p99 {step['gap_p99_ms'] or 0:.1f} ms, proxy CPU {step['cpu_share']:.0%}, "
            f"errors {step['errors']} -> {'holds' if step['passed'] else 'does not hold'}"
        )
        return bool(step["passed"])

    held, failed = await capacity_search(probe, steps_within(s.paced_steps, limit), s.paced_refine)
    return {
        "steps": [steps[c] for c in sorted(steps)],
        "capacity": held,
        "bound": "harness" if way.name == "direct" or failed is None else "proxy",
        "baseline": baseline,
    }


def steps_within(steps: tuple[int, ...], limit: int | None) -> list[int]:
    """The steps up to ``limit``, and ``limit`` itself: a proxy that holds every step below the harness's
    own limit is measured at that limit too (else 448 going direct capped a proxy at the step of 256)."""
    reach = [c for c in steps if limit is None or c <= limit]
    if limit is not None and (not reach or reach[-1] < limit):
        reach.append(limit)
    return reach


async def capacity_search(
    holds_at: Callable[[int], Awaitable[bool]], steps: list[int], refine: int
) -> tuple[int | None, int | None]:
    """The highest concurrency that held and the lowest that did not (None: none such): ``steps`` in
    order until one fails (halving below the first if that one does), then ``refine`` bisections."""
    held: int | None = None
    failed: int | None = None
    for c in steps:
        if not await holds_at(c):
            failed = c
            break
        held = c
    while held is None and failed is not None and failed > 1:
        if await holds_at(failed // 2):
            held = failed // 2
        else:
            failed //= 2
    for _ in range(refine):
        if held is None or failed is None or failed - held <= 1:
            break
        middle = (held + failed) // 2
        if await holds_at(middle):
            held = middle
        else:
            failed = middle
    return held, failed


async def measure(
    way: Way,
    s: Settings,
    say: Say,
    startup_s: float | None,
    *,
    direct_rate: Callable[[float], Any] | None = None,
    paced_baseline: dict[str, Any] | None = None,
    paced_limit: int | None = None,
    memory: bool = True,
) -> dict[str, Any]:
    out: dict[str, Any] = {"startup_s": startup_s}
    await asyncio.sleep(1.0)
    out["rss_idle_mb"] = way.proc.rss_bytes() / MB
    with RssSampler(way.proc) as load:
        say(f"{way.name}: concurrency 1, non-streaming then streaming")
        out["c1"] = await at_c1(way, s, stream=False)
        out["c1_stream"] = await at_c1(way, s, stream=True)
        say(
            f"{way.name}: c=1 p50 {out['c1']['p50_ms']:.3f} ms; saturation, non-streaming (c={s.concurrency})"
        )
        out["nonstream"] = await saturation(way, s, stream=False)
        say(f"{way.name}: {out['nonstream']['rps']:,.0f} req/s; saturation, streaming 64 chunks")
        out["stream"] = await saturation(way, s, stream=True)
        for kind in ("nonstream", "stream"):
            if out[kind]["errors"]:
                say(f"{way.name}: {kind} saturation had failed requests: {out[kind]['error_kinds']}")
        rate = moderate_rate(s, out["nonstream"]["rps"])
        say(f"{way.name}: {out['stream']['rps']:,.0f} streams/s; open loop at {rate:.0f} req/s")
        if direct_rate is not None:
            await direct_rate(rate)
        out["rate"] = await at_rate(way, rate, s)
        if memory:
            out.update(await memory_run(way, s, out["nonstream"]["rps"], say))
        out["paced"] = await paced(way, s, paced_baseline, paced_limit, say)
    out["rss_load_mb"] = load.peak_bytes / MB
    return out
