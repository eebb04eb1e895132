"""The whole benchmark in one command: ``.venv/bin/python -m bench.run [--quick] [--skip-litellm]``.

Measures going direct to the bench upstream, through our gateway and through LiteLLM's proxy (one proxy
core, the load generator and upstream on the other), then writes bench/results/latest.{json,md} + a plot.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench import report, servers
from bench.procs import Proc, pin_self, port_is_free
from bench.suite import Settings, Way, at_rate, measure, wait_ready

RESULTS = servers.BENCH / "results"
PACED_RULE = (
    "A proxy carries N streams when, with N paced streams open through its one core, TTFT p99 and "
    "inter-token gap p99 stay within 2x the upstream's own (direct, 16 streams), with no errors. "
    "Streams start staggered over one stream's length. Direct's highest holding step is the harness limit."
)


class Progress:
    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        print(f"[{time.perf_counter() - self.t0:6.1f}s] {message}", flush=True)


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} x {model}, {mem_gb:.0f} GiB, {platform.system()} {platform.release()}"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("uvicorn", "starlette", "aiohttp", "uvloop", "httptools", "orjson"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[name] = metadata.version(name)
    out["litellm_proxy"] = servers.LITELLM_VERSION
    return out


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return ""


async def run(args: argparse.Namespace, say: Progress) -> dict[str, Any]:
    s = Settings.make(args.quick, args.requests)
    out_dir: Path = args.out
    ports = {
        "upstream": args.base_port,
        "ours": args.base_port + 1,
        "litellm": args.base_port + 2,
        "bare": args.base_port + 3,
    }
    busy = [f"{n}:{p}" for n, p in ports.items() if not port_is_free(p)]
    if busy:
        raise SystemExit(f"ports in use: {', '.join(busy)}; pick others with --base-port")
    notes: list[str] = []
    results: dict[str, Any] = {"proxies": {}, "paced_rule": PACED_RULE, "profile": {}}
    procs: list[Proc] = []
    try:
        want_litellm = not args.skip_litellm and (args.litellm or not args.quick)
        exe = servers.ensure_litellm(say) if want_litellm else None
        if exe is None and want_litellm:
            notes.append("LiteLLM could not be installed; its column is empty")
        say(f"starting the upstream on port {ports['upstream']} (core 1)")
        upstream = servers.start_upstream(ports["upstream"], out_dir)
        procs.append(upstream)
        direct = Way("direct", ports["upstream"], upstream, "fast", "paced", servers.API_KEY)
        up_start = await wait_ready(direct, 20.0)
        if up_start is None:
            raise SystemExit("the upstream did not start:\n" + upstream.log_tail())
        rates: dict[str, Any] = {}

        async def direct_rate(rate: float) -> None:
            if str(int(rate)) not in rates:
                say(f"direct: open loop at {rate:.0f} req/s (baseline)")
                rates[str(int(rate))] = await at_rate(direct, rate, s)

        say("== direct to the upstream")
        d = await measure(direct, s, say, up_start, direct_rate=direct_rate, memory=False)
        d["rates"] = rates
        results["proxies"]["direct"] = d
        baseline = d["paced"]["baseline"]
        results["paced_baseline"] = baseline
        limit = d["paced"]["capacity"]
        contenders: list[tuple[str, Any]] = [("ours", None)]
        if not args.skip_bare:
            contenders.insert(0, ("bare", None))
        if exe is not None:
            contenders.append(("litellm", exe))
        for name, lite_exe in contenders:
            say(f"== {name}: starting on port {ports[name]} (core 0)")
            if name == "bare":
                proc = servers.start_passthrough(ports["bare"], ports["upstream"], out_dir)
                way = Way("bare", ports["bare"], proc, "fast", "paced", servers.API_KEY, upstream)
            elif name == "ours":
                proc = servers.start_gateway(ports["ours"], ports["upstream"], out_dir)
                way = Way("ours", ports["ours"], proc, "bench-fast", "bench-paced", servers.API_KEY, upstream)
            else:
                proc = servers.start_litellm(lite_exe, ports["litellm"], ports["upstream"], out_dir)
                way = Way(
                    "litellm", ports["litellm"], proc, "bench-fast", "bench-paced", servers.API_KEY, upstream
                )
            procs.append(proc)
            startup = await wait_ready(way, 120.0)
            if startup is None:
                notes.append(f"{name} did not answer: {proc.log_tail(5)}")
                say(f"{name} did not start:\n{proc.log_tail()}")
                proc.stop()
                continue
            say(f"{name}: first answer {startup:.2f} s after spawning")
            results["proxies"][name] = await measure(
                way,
                s,
                say,
                startup,
                direct_rate=direct_rate,
                paced_baseline=baseline,
                paced_limit=limit,
                memory=name != "bare",  # the limit's throughput and latency matter; its memory does not
            )
            if name == "ours" and not args.no_profile:
                from bench.profile import profile

                for stream in (False, True):
                    kind = "streaming" if stream else "non-streaming"
                    say(f"ours: py-spy profile under saturation ({kind})")
                    found = await profile(way, stream, 6.0 if not args.quick else 3.0, out_dir)
                    if found is None:
                        notes.append("py-spy not installed: no profile (pip install py-spy)")
                        break
                    results["profile"]["stream" if stream else "nonstream"] = found
            proc.stop()
        say("== routing decision microbenchmark (50 backends, live stats, core 0)")
        results["decision"] = await decision(5_000 if args.quick else 20_000, out_dir, notes)
        if not args.skip_tracing:
            say("== tracing off vs on, 100% sampled, alternated rounds (python -m bench.tracing, core 0)")
            results["tracing"] = await tracing(args.quick, out_dir / "tracing", notes)
        if not args.skip_scaling:
            say("== gateway serve --workers 2 against one worker, with Redis (python -m bench.scaling)")
            results["scaling"] = await scaling(args.quick, out_dir / "scaling", notes)
    finally:
        for proc in reversed(procs):
            proc.stop()
    results["meta_notes"] = notes
    return results


async def decision(iterations: int, out_dir: Path, notes: list[str]) -> dict[str, Any] | None:
    path = out_dir / "decision.json"
    argv = ["taskset", "-c", "0", sys.executable, "-m", "bench.decision", "--json", str(path)]
    child = await asyncio.create_subprocess_exec(
        *argv, "--iterations", str(iterations), env={**os.environ, "PYTHONPATH": str(servers.REPO)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    text, _ = await child.communicate()
    if child.returncode != 0 or not path.exists():
        notes.append("decision microbenchmark failed: " + text.decode(errors="replace")[-300:])
        return None
    result: dict[str, Any] = json.loads(path.read_text())
    return result


async def tracing(quick: bool, out_dir: Path, notes: list[str]) -> dict[str, Any] | None:
    """bench.tracing in a process of its own: the gateway's CPU per request with OpenTelemetry tracing
    off and on (every request sampled), in alternated rounds; it prints the ratio."""
    argv = [sys.executable, "-m", "bench.tracing", "--out", str(out_dir), "--rounds", "2" if quick else "4"]
    child = await asyncio.create_subprocess_exec(
        *argv, *(["--quick"] if quick else []), env={**os.environ, "PYTHONPATH": str(servers.REPO)},
    )  # fmt: skip
    await child.wait()  # its rounds and its ratio go to our stdout as they come
    path = out_dir / "tracing.json"
    if child.returncode != 0 or not path.exists():
        notes.append(f"bench.tracing did not run (exit {child.returncode}): see its output above")
        return None
    result: dict[str, Any] = json.loads(path.read_text())
    return result


async def scaling(quick: bool, out_dir: Path, notes: list[str]) -> dict[str, Any] | None:
    """bench.scaling in a process of its own, on every core (this one is pinned to the load core): its
    throughput ratio where the machine has the cores for it, its shared-state check everywhere."""
    cores = f"0-{(os.cpu_count() or 1) - 1}"
    argv = ["taskset", "-c", cores, sys.executable, "-m", "bench.scaling", "--out", str(out_dir)]
    child = await asyncio.create_subprocess_exec(
        *argv, *(["--quick"] if quick else []), env={**os.environ, "PYTHONPATH": str(servers.REPO)},
    )  # fmt: skip
    await child.wait()  # its progress and tables go to our stdout as they come
    path = out_dir / "scaling.json"
    if child.returncode == 2 or not path.exists():
        notes.append(f"bench.scaling did not run (exit {child.returncode}): see its output above")
        return None
    result: dict[str, Any] = json.loads(path.read_text())
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument(
        "--quick", action="store_true", help="short phases, 10k-request memory run, no LiteLLM"
    )
    parser.add_argument("--litellm", action="store_true", help="measure LiteLLM's proxy even with --quick")
    parser.add_argument(
        "--skip-litellm", action="store_true", help="do not install or measure LiteLLM's proxy"
    )
    parser.add_argument(
        "--skip-bare",
        action="store_true",
        help="do not measure the bare pass-through proxy (bench/passthrough.py)",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profiles of the gateway")
    parser.add_argument(
        "--skip-scaling",
        action="store_true",
        help="do not run bench.scaling (--workers 2 against one worker, and the fleet-wide shared state)",
    )
    parser.add_argument(
        "--skip-tracing",
        action="store_true",
        help="do not run bench.tracing (the gateway's CPU per request with tracing off and on)",
    )
    parser.add_argument("--requests", type=int, default=None, help="requests in the memory run (100k full)")
    parser.add_argument(
        "--base-port", type=int, default=18001, help="upstream port; gateway +1, LiteLLM +2, bare +3"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results and logs go")
    args = parser.parse_args(argv)
    say = Progress()
    args.out.mkdir(parents=True, exist_ok=True)
    if (os.cpu_count() or 1) < 2:
        print(
            "warning: fewer than 2 CPUs; the proxy and the load generator will share a core", file=sys.stderr
        )
    pin_self({1} if (os.cpu_count() or 1) >= 2 else {0})
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    load_start = loadavg()
    import uvloop

    results = uvloop.run(run(args, say))
    results["meta"] = {
        "command": " ".join([".venv/bin/python -m bench.run", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(),
        "versions": versions(),
        "started_at": started,
        "wall_s": time.perf_counter() - say.t0,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "quick": args.quick,
        "notes": results.pop("meta_notes", []),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latest.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    (args.out / "latest.md").write_text(report.markdown(results))
    plotted = report.plot(results, args.out / "paced.png")
    print()
    print(report.text_table(report.HEADER, report.rows(results)))
    print()
    print("\n".join(report.goal_lines(results)))
    print()
    print(report.text_table(report.PACED_HEADER, report.paced_rows(results)))
    written = ["latest.json", "latest.md", *(["paced.png"] if plotted else [])]
    print(f"\nwrote {', '.join(str(args.out / w) for w in written)} in {results['meta']['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
