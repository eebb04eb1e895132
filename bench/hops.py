"""One request's hops through the gateway: ``python -m bench.hops [--n 200]``.

Starts the bench upstream and a gateway whose request path carries ``time.perf_counter_ns`` marks (patched
in by this module, run as the gateway's entry point with ``--serve``), sends whole answers at c=1 and
streams one every 200 ms (the light load of ``bench.ab_server``), each way also going direct, and prints
per hop the median time since the client's send (the same monotonic clock in both processes). The marks
cost a little themselves; the hops, not the total, are the point (docs/performance.md, issue 39).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import time
from functools import wraps
from pathlib import Path
from typing import Any

from bench import servers
from bench.procs import pin_self, start
from bench.suite import Way, wait_ready
from bench.tracing import free_port

OUT = servers.BENCH / "results" / "hops"
MARKS: list[tuple[str, int]] = []


def mark(label: str) -> None:
    MARKS.append((label, time.perf_counter_ns()))


def patch(owner: Any, name: str, *, before: str | None = None, after: str | None = None) -> None:
    original = getattr(owner, name)
    if asyncio.iscoroutinefunction(original):

        @wraps(original)
        async def marked_async(*args: Any, **kwargs: Any) -> Any:
            if before:
                mark(before)
            result = await original(*args, **kwargs)
            if after:
                mark(after)
            return result

        setattr(owner, name, marked_async)
        return

    @wraps(original)
    def marked(*args: Any, **kwargs: Any) -> Any:
        if before:
            mark(before)
        result = original(*args, **kwargs)
        if after:
            mark(after)
        return result

    setattr(owner, name, marked)


def serve_marked(argv: list[str], marks_path: Path) -> int:
    """``gateway serve`` with the marks; SIGUSR2 forgets those so far, SIGUSR1 writes them out."""
    from gateway import app
    from gateway.backends import openai_compat, wire, wire_connection
    from gateway.cli import main
    from gateway.request import connection, exchange, proxy, response_cycle
    from gateway.runtime import Runtime

    protocol = connection.GuardedHttpToolsProtocol
    patch(protocol, "data_received", before="gateway wakes for the request")
    patch(protocol, "on_headers_complete", after="request parsed")
    patch(app, "serve", before="ASGI task's first step")
    patch(Runtime, "authenticate", after="key checked")
    patch(proxy, "read_body", after="body read")
    patch(Runtime, "decide", after="decided")
    patch(exchange.Exchange, "admit", after="admitted")
    patch(wire.WirePool, "_reusable", before="pool checkout", after="pool checked out")
    patch(wire.WirePool, "_connect", before="new upstream connection")
    patch(wire_connection.Connection, "begin", after="upstream request written")
    patch(wire_connection.Connection, "data_received", before="upstream answers")
    patch(wire_connection.Connection, "on_headers_complete", after="upstream head parsed")
    patch(openai_compat.OpenAICompatClient, "open", after="task woken with the head")
    patch(proxy, "first_events", after="first event parsed")
    patch(response_cycle.GatewayCycle, "_head", after="head built")
    patch(response_cycle.GatewayCycle, "_send_first_piece", after="first write to the client")

    def dump(*_: Any) -> None:
        marks_path.write_text(json.dumps(MARKS))
        MARKS.clear()

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, lambda *_: MARKS.clear())
    sys.argv = ["gateway", *argv]
    return main()


async def measure(n: int, out: Path) -> dict[str, Any]:
    from bench.loadgen import connect

    upstream_port = free_port()
    upstream = servers.start_upstream(upstream_port, out)
    policy = servers.gateway_policy(upstream_port, out)
    port = free_port()
    marks_path = out / "marks.json"
    argv = [sys.executable, "-m", "bench.hops", "--serve", str(marks_path), "serve", "--policy", str(policy)]
    argv += ["--port", str(port), "--ledger", str(out / "ledger.sqlite3")]
    env = {"PYTHONPATH": os.getcwd(), "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    gateway = start("gateway-marked", argv, cpus="0", log_dir=out, env=env)
    direct = Way("direct", upstream_port, upstream, "fast", "paced", servers.API_KEY)
    ours = Way("ours", port, gateway, "bench-fast", "bench-paced", servers.API_KEY, upstream)
    result: dict[str, Any] = {}
    try:
        if await wait_ready(direct, 20.0) is None or await wait_ready(ours, 120.0) is None:
            raise SystemExit("did not start:\n" + gateway.log_tail())
        for kind, stream, gap_s in (("whole answer at c=1", False, 0.0), ("stream at 5/s", True, 0.2)):
            for way in (direct, ours):
                target = way.target(stream)
                raw = target.request_bytes()
                client = await connect(target, False)
                for _ in range(50):  # warm: the connections, the first imports
                    await client.request(raw, time.perf_counter())
                if way is ours:
                    os.kill(gateway.pid, signal.SIGUSR2)
                samples = []
                for _ in range(n):
                    if gap_s:
                        await asyncio.sleep(gap_s)
                    s = await client.request(raw, time.perf_counter())
                    samples.append((s.started, s.first_event if stream else s.done))
                client.close()
                result[f"{kind} {way.name}"] = samples
            os.kill(gateway.pid, signal.SIGUSR1)
            await asyncio.sleep(0.5)
            result[f"{kind} marks"] = json.loads(marks_path.read_text())
    finally:
        gateway.stop()
        upstream.stop()
    return result


def hops(samples: list[tuple[float, float]], marks: list[tuple[str, int]]) -> list[tuple[str, float, int]]:
    """Each mark's median time (us) since its request's send: a mark counts for the request whose send
    it follows, once (the first of its label)."""
    sends = [int(started * 1e9) for started, _ in samples]
    at: dict[str, list[float]] = {}
    for i, (started, done) in enumerate(samples):
        until = sends[i + 1] if i + 1 < len(sends) else 1 << 62
        seen: set[str] = set()
        for label, t in marks:
            if sends[i] <= t < until and label not in seen:
                seen.add(label)
                at.setdefault(label, []).append((t - sends[i]) / 1e3)
        at.setdefault("the client has it", []).append((done - started) * 1e6)
    rows = [(label, statistics.median(ts), len(ts)) for label, ts in at.items()]
    return sorted(rows, key=lambda row: row[1])


def report(result: dict[str, Any]) -> str:
    lines = []
    for kind in ("whole answer at c=1", "stream at 5/s"):
        direct = statistics.median(done - started for started, done in result[f"{kind} direct"]) * 1e6
        ours = statistics.median(done - started for started, done in result[f"{kind} ours"]) * 1e6
        lines.append(f"\n{kind}: direct {direct:.0f} us, ours {ours:.0f} us, added {ours - direct:.0f} us")
        before = 0.0
        for label, median, count in hops(result[f"{kind} ours"], result[f"{kind} marks"]):
            lines.append(f"  {label:32} {median:8.1f} us  (+{median - before:6.1f})  n={count}")
            before = median
    lines.append(f"1-min load average {os.getloadavg()[0]:.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--serve"]:
        return serve_marked(args[2:], Path(args[1]))
    parser = argparse.ArgumentParser(prog="python -m bench.hops", description=__doc__)
    parser.add_argument("--n", type=int, default=200, help="requests each way (streams: 200 ms apart)")
    parser.add_argument("--out", type=Path, default=OUT)
    parsed = parser.parse_args(args)
    parsed.out.mkdir(parents=True, exist_ok=True)
    for stale in parsed.out.glob("ledger.sqlite3*"):
        stale.unlink()
    pin_self({1})
    import uvloop

    print(report(uvloop.run(measure(parsed.n, parsed.out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
