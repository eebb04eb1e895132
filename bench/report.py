"""Turns a benchmark run's results into a table with ratios (ours/direct, ours vs LiteLLM), the goals of
issue 7 checked one by one, a markdown file and a plot of paced-stream capacity."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

PROXIES = ("direct", "bare", "ours", "litellm")  # bare: the pass-through limit (bench/passthrough.py)
Getter = Callable[[dict[str, Any], dict[str, Any]], float | None]  # (proxy result, direct result)


def _get(r: dict[str, Any], *path: str) -> float | None:
    value: Any = r
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, (int, float)) else None


def _added(*path: str) -> Getter:
    def get(r: dict[str, Any], direct: dict[str, Any]) -> float | None:
        mine, base = _get(r, *path), _get(direct, *path)
        if r is direct or mine is None or base is None:
            return None
        return mine - base

    return get


def _added_at_rate(stat: str) -> Getter:
    def get(r: dict[str, Any], direct: dict[str, Any]) -> float | None:
        rate = _get(r, "rate", "rate")
        if r is direct or rate is None:
            return None
        mine = _get(r, "rate", stat)
        base = _get(direct, "rates", str(int(rate)), stat)
        return None if mine is None or base is None else mine - base

    return get


def _plain(*path: str) -> Getter:
    return lambda r, _direct: _get(r, *path)


def _percent(*path: str) -> Getter:
    def get(r: dict[str, Any], _direct: dict[str, Any]) -> float | None:
        share = _get(r, *path)
        return None if share is None else share * 100.0

    return get


def _added_self(after: str, before: str) -> Getter:
    def get(r: dict[str, Any], _direct: dict[str, Any]) -> float | None:
        a, b = _get(r, after), _get(r, before)
        return None if a is None or b is None else a - b

    return get


# (label, getter, higher is better, decimals)
ROWS: list[tuple[str, Getter, bool, int]] = [
    ("Non-streaming req/s at saturation (c=64)", _plain("nonstream", "rps"), True, 0),
    ("Streaming req/s at saturation (64 chunks, c=64)", _plain("stream", "rps"), True, 0),
    ("Latency c=1 p50 (ms)", _plain("c1", "p50_ms"), False, 3),
    ("Latency c=1 p99 (ms)", _plain("c1", "p99_ms"), False, 3),
    ("Added latency c=1 p50 (ms)", _added("c1", "p50_ms"), False, 3),
    ("Added latency c=1 p99 (ms)", _added("c1", "p99_ms"), False, 3),
    ("Added TTFT c=1 p50 (ms, stream)", _added("c1_stream", "ttft_p50_ms"), False, 3),
    ("Added TTFT c=1 p99 (ms, stream)", _added("c1_stream", "ttft_p99_ms"), False, 3),
    ("Open-loop rate used (req/s)", _plain("rate", "rate"), True, 0),
    ("Added latency at that rate p50 (ms)", _added_at_rate("p50_ms"), False, 3),
    ("Added latency at that rate p99 (ms)", _added_at_rate("p99_ms"), False, 3),
    ("CPU per request (ms, non-streaming)", _plain("nonstream", "cpu_ms_per_req"), False, 3),
    ("CPU per stream (ms, 64 chunks)", _plain("stream", "cpu_ms_per_stream"), False, 3),
    ("CPU per streamed chunk (us)", _plain("stream", "cpu_us_per_chunk"), False, 1),
    ("Start to first answer (s)", _plain("startup_s"), False, 2),
    ("RSS idle (MB)", _plain("rss_idle_mb"), False, 1),
    ("RSS under load, peak (MB)", _plain("rss_load_mb"), False, 1),
    ("Requests in the memory run", _plain("n_requests"), True, 0),
    ("RSS after the memory run (MB)", _plain("rss_after_n_mb"), False, 1),
    ("RSS growth over the memory run (MB)", _added_self("rss_after_n_mb", "rss_before_n_mb"), False, 1),
    ("Paced streams one core carries", _plain("paced", "capacity"), True, 0),
    ("Failed requests, non-streaming saturation", _plain("nonstream", "errors"), False, 0),
    ("Failed requests, streaming saturation", _plain("stream", "errors"), False, 0),
    ("Other processes on the proxy core, c=1 (%)", _percent("c1", "core_foreign_share"), False, 1),
    (
        "Other processes on the proxy core, saturation (%)",
        _percent("nonstream", "core_foreign_share"),
        False,
        1,
    ),
    ("Other processes on the load core, c=1 (%)", _percent("c1", "load_core_foreign_share"), False, 1),
]


# Context for the other rows, not figures of merit: no ratios.
NOT_COMPARED = frozenset(
    {
        "Open-loop rate used (req/s)",
        "Requests in the memory run",
        "Failed requests, non-streaming saturation",
        "Failed requests, streaming saturation",
        "Other processes on the proxy core, c=1 (%)",
        "Other processes on the proxy core, saturation (%)",
        "Other processes on the load core, c=1 (%)",
    }
)


def _fmt(value: float | None, decimals: int) -> str:
    if value is None:
        return "-"
    return f"{value:,.{decimals}f}"


def _factor(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}x"


def rows(results: dict[str, Any]) -> list[list[str]]:
    proxies = results.get("proxies", {})
    direct = proxies.get("direct", {})
    out = []
    for label, getter, higher, decimals in ROWS:
        values = {p: getter(proxies[p], direct) if p in proxies else None for p in PROXIES}
        ours, base, lite, bare = values["ours"], values["direct"], values["litellm"], values["bare"]
        vs_direct = ours / base if ours is not None and base else None
        vs_bare = ours / bare if ours is not None and bare else None
        vs_lite = None
        if ours is not None and lite is not None and ours > 0 and lite > 0:
            vs_lite = ours / lite if higher else lite / ours
        if label in NOT_COMPARED:
            vs_direct = vs_lite = vs_bare = None
        cells = [_fmt(values[p], decimals) for p in PROXIES]
        out.append([label, *cells, _factor(vs_direct), _factor(vs_bare), _factor(vs_lite)])
    return out


HEADER = [
    "metric", "direct", "bare proxy", "ours", "LiteLLM",
    "ours/direct", "ours/bare", "ours vs LiteLLM (x better)",
]  # fmt: skip


def goals(results: dict[str, Any]) -> list[tuple[str, str, bool | None]]:
    """Issues 7 and 18's goals: (goal, measured, met); met is None when the run could not tell."""
    p = results.get("proxies", {})
    ours, lite, direct = p.get("ours", {}), p.get("litellm", {}), p.get("direct", {})

    def ratio(path: tuple[str, ...]) -> float | None:
        a, b = _get(ours, *path), _get(lite, *path)
        return a / b if a is not None and b else None

    out: list[tuple[str, str, bool | None]] = []
    bare = p.get("bare", {})
    for goal, path in (
        ("non-streaming req/s >= 50% of the bare pass-through", ("nonstream", "rps")),
        ("streaming req/s >= 50% of the bare pass-through", ("stream", "rps")),
    ):
        mine, limit = _get(ours, *path), _get(bare, *path)
        share = mine / limit if mine is not None and limit else None
        out.append((goal, "-" if share is None else f"{share:.0%}", None if share is None else share >= 0.5))
    for goal, path, need in (
        ("non-streaming req/s >= 20x LiteLLM", ("nonstream", "rps"), 20.0),
        ("streaming req/s >= 40x LiteLLM", ("stream", "rps"), 40.0),
        ("paced streams per core >= 40x LiteLLM", ("paced", "capacity"), 40.0),
    ):
        r = ratio(path)
        out.append((goal, _factor(r), None if r is None else r >= need))
    for goal, getter, limit in (
        ("added latency c=1 p50 < 1 ms", _added("c1", "p50_ms"), 1.0),
        ("added latency c=1 p99 < 2 ms", _added("c1", "p99_ms"), 2.0),
        ("added TTFT c=1 p50 < 1 ms", _added("c1_stream", "ttft_p50_ms"), 1.0),
        ("start to first answer < 1.5 s", _plain("startup_s"), 1.5),
        ("idle memory < 100 MB", _plain("rss_idle_mb"), 100.0),
    ):
        v = getter(ours, direct)
        out.append((goal, _fmt(v, 3), None if v is None else v < limit))
    growth = _added_self("rss_after_n_mb", "rss_before_n_mb")(ours, direct)
    before = _get(ours, "rss_before_n_mb")
    n = _get(ours, "n_requests")
    flat = None if growth is None or before is None else growth <= max(5.0, 0.05 * before)
    out.append(
        (f"memory flat over {_fmt(n, 0)} requests (growth <= 5 MB or 5%)", f"{_fmt(growth, 1)} MB", flat)
    )
    tracing = results.get("tracing")
    if isinstance(tracing, dict):  # issue 37: OpenTelemetry tracing on at 100% sampling (bench.tracing)
        for label, key in (("streamed", "cpu_ms_per_stream"), ("whole", "cpu_ms_per_req")):
            r = (tracing.get(key) or {}).get("ratio")
            out.append(
                (f"CPU per {label} request with tracing on (100% sampled) <= 1.10x off", _fmt(r, 3),
                 None if r is None else r <= 1.10)
            )  # fmt: skip
    scaling = results.get("scaling")
    if isinstance(scaling, dict):
        g = scaling.get("goal", {})
        status = str(g.get("status", "n/a"))
        judged = True if status == "met" else False if status == "MISSED" else None
        measured = str(g.get("measured", "-")) + ("" if judged is not None else f"; {status}")
        out.append((str(g.get("goal", "two workers")), measured, judged))
        check = scaling.get("shared_state", {})
        out.append(
            (
                "budgets and rate limits hold fleet-wide with 2 workers over Redis",
                "passed" if check.get("passed") else "failed",
                bool(check.get("passed")),
            )
        )
    decision = _get(results, "decision", "snapshot_and_decide", "p50_us")
    out.append(
        (
            "one routing decision, 50 backends, < 50 us (p50)",
            f"{_fmt(decision, 1)} us",
            None if decision is None else decision < 50.0,
        )
    )
    return out


def paced_rows(results: dict[str, Any]) -> list[list[str]]:
    out = []
    for name in PROXIES:
        steps = _get_steps(results, name)
        for s in steps:
            out.append(
                [
                    name,
                    str(s["concurrency"]),
                    _fmt(s.get("streams_per_s"), 1),
                    _fmt(s.get("ttft_p50_ms"), 1),
                    _fmt(s.get("ttft_p99_ms"), 1),
                    _fmt(s.get("gap_p99_ms"), 1),
                    _fmt(s["cpu_share"] * 100.0 if s.get("cpu_share") is not None else None, 0),
                    _fmt(s.get("cpu_us_per_chunk"), 1),
                    str(s.get("errors", 0)),
                    "yes" if s.get("passed") else "no",
                ]
            )
    return out


PACED_HEADER = [
    "proxy",
    "streams",
    "streams/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "gap p99 ms",
    "CPU %",
    "CPU us/chunk",
    "errors",
    "holds",
]


def _get_steps(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    steps = results.get("proxies", {}).get(name, {}).get("paced", {}).get("steps", [])
    return steps if isinstance(steps, list) else []


def text_table(header: list[str], body: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=False))
        )
        for row in [header, *body]
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def md_table(header: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def goal_lines(results: dict[str, Any]) -> list[str]:
    marks = {True: "met", False: "MISSED", None: "n/a"}
    return [f"- {marks[ok]}: {goal} (measured {value})" for goal, value, ok in goals(results)]


def markdown(results: dict[str, Any]) -> str:
    meta = results.get("meta", {})
    parts = [
        "# Gateway benchmark",
        "",
        f"Command: `{meta.get('command', '')}`  ",
        f"Machine: {meta.get('machine', '')}  ",
        f"Run: {meta.get('started_at', '')}, {meta.get('wall_s', 0):.0f} s; load average before/after: "
        f"{meta.get('loadavg_start', '')} / {meta.get('loadavg_end', '')}",
        "",
        md_table(HEADER, rows(results)),
        "",
        "## Goals (issues 7 and 18)",
        "",
        *goal_lines(results),
        "",
        "## Paced streams (first token after 100 ms, then 50 tokens/s)",
        "",
        str(results.get("paced_rule", "")),
        "",
        md_table(PACED_HEADER, paced_rows(results)),
    ]
    decision = results.get("decision")
    if isinstance(decision, dict) and "decide_only" in decision:
        parts += ["", f"## One routing decision ({decision.get('backends')} backends, live stats)", ""]
        body = [
            [
                name,
                _fmt(decision[name]["mean_us"], 1),
                _fmt(decision[name]["p50_us"], 1),
                _fmt(decision[name]["p99_us"], 1),
            ]
            for name in ("decide_only", "snapshot_and_decide", "full_cycle")
        ]
        parts.append(md_table(["step", "mean us", "p50 us", "p99 us"], body))
    hot = results.get("profile", {})
    for kind, entries in hot.items() if isinstance(hot, dict) else []:
        if isinstance(entries, dict) and entries.get("top_self"):
            parts += ["", f"## Hot spots in the gateway ({kind}, py-spy, share of samples)", ""]
            by_package = ", ".join(f"{name} {share:.0%}" for name, share in entries.get("by_package", [])[:8])
            parts += [f"- self time by package: {by_package}"]
            parts += [f"- {share:.1%} self: {frame}" for frame, share in entries["top_self"][:12]]
            parts += [f"- {share:.1%} incl.: {frame}" for frame, share in entries.get("top_ours", [])[:12]]
            innermost = entries.get("top_innermost", [])[:12]
            parts += [f"- {share:.1%} innermost own frame: {frame}" for frame, share in innermost]
    notes = meta.get("notes") or []
    if notes:
        parts += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(parts) + "\n"


def plot(results: dict[str, Any], path: Path) -> bool:
    """Added TTFT p99 and inter-token gap p99 against concurrent paced streams, per proxy."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter
    except ImportError:
        return False
    plain = FuncFormatter(lambda v, _pos: f"{v:g}")
    ticks: set[int] = set()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in PROXIES:
        steps = [s for s in _get_steps(results, name) if s.get("ttft_p99_ms") is not None]
        if not steps:
            continue
        xs = [s["concurrency"] for s in steps]
        ticks.update(xs)
        ax1.plot(xs, [s["ttft_p99_ms"] for s in steps], marker="o", label=name)
        ax2.plot(xs, [s["gap_p99_ms"] or 0.0 for s in steps], marker="o", label=name)
    base = results.get("paced_baseline", {})
    for ax, key, title in (
        (ax1, "ttft_p99_ms", "TTFT p99 (ms)"),
        (ax2, "gap_p99_ms", "inter-token gap p99 (ms)"),
    ):
        if base.get(key):
            ax.axhline(2 * base[key], color="grey", linestyle="--", linewidth=1, label="2x upstream")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted(ticks))
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.set_xlabel("concurrent paced streams (one proxy core)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
