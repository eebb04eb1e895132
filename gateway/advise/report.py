"""What ``gateway advise`` shows: the table of plans (today's first, the recommendation marked, its
saving), the schedule, the honest limits, ``advice.json``, and two plots (matplotlib only here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.advise.plans import PlanResult
from gateway.advise.sampling import describe
from gateway.advise.search import SENSITIVITY, Advice


def render_table(advice: Advice) -> Any:
    from rich.table import Table

    title = (
        f"{advice.workload}: {advice.requests:,} requests over {seen(advice.days_seen)};"
        f" SLO target {100 * advice.slo_target:.1f}% of requests"
    )
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in ("plan", "capacity", "$/day", "$/1M out", "SLO", "share", "idle GPU h", ""):
        table.add_column(column, justify="left" if column in ("plan", "capacity", "share", "") else "right")
    for r in advice.results:
        mark = "recommended" if r is advice.recommended else ""
        table.add_row(
            r.plan.name,
            r.plan.label or "-",
            f"{r.usd_per_day:,.2f}",
            "-" if r.usd_per_mtok is None else f"{r.usd_per_mtok:,.2f}",
            f"{100 * r.slo_attainment:.2f}%",
            " ".join(f"{n} {100 * s:.0f}%" for n, s in r.share.items() if s >= 0.005),
            f"{r.idle_gpu_hours:,.1f}",
            mark,
        )
    return table


def summary_lines(advice: Advice) -> list[str]:
    rec, today = advice.recommended, advice.today
    lines = [f"recommended: {rec.plan.name} ({rec.plan.label or 'no pool'}), ${rec.usd_per_day:,.2f}/day"]
    if rec is not today:
        saving = today.usd_per_day - rec.usd_per_day
        lines.append(
            f"  saves ${saving:,.2f}/day ({_percent(saving, today.usd_per_day)}) over today's capacity"
        )
    for other in ("always-on", "all-api"):
        r = advice.result(other)
        if r is not None and r is not rec:
            lines.append(f"  {other}: ${r.usd_per_day:,.2f}/day at {100 * r.slo_attainment:.2f}% SLO")
    if advice.windows:
        lines.append("schedule (UTC):")
        for pool, windows in advice.windows.items():
            lines += [f"  {pool} {w.describe()}" for w in windows]
            for kind in advice.day_kinds:
                if not any(w.days == kind for w in windows):
                    lines.append(f"  {pool}, {kind}: off all day (the API is cheaper at every hour)")
        always = advice.result("always-on")
        sched = advice.result("schedule")
        if always is not None and sched is not None:
            saving = always.usd_per_day - sched.usd_per_day
            lines.append(
                f"  saves ${saving:,.2f}/day ({_percent(saving, always.usd_per_day)}) over always-on"
            )
    lines.append(
        f"limits: the plan is as good as the traffic it replays: {seen(advice.days_seen)},"
        f" {advice.requests:,} requests seen"
        + ("" if advice.days_seen >= 7 else "; less than a week, so weekdays and weekends are not both known")
    )
    more = round(100 * (SENSITIVITY - 1))
    for pool, s in advice.sensitivity.items():
        lines.append(
            f"  with +{more}% traffic, {pool} needs {s.peak_replicas_at_scale} at peak"
            f" (now {s.peak_replicas}),"
            f" {s.replica_hours_per_day_at_scale} replica-hours a day (now {s.replica_hours_per_day})"
        )
    if advice.samples:
        lines += describe(advice.samples, advice.days_cut)
    return lines


def seen(days: float) -> str:
    return f"{days:.2f} days" if days >= 1 else f"{24 * days:.2f} hours"


def _percent(part: float, whole: float) -> str:
    return "-" if whole <= 0 else f"{100 * part / whole:.1f}%"


def to_json(advice: Advice) -> dict[str, Any]:
    return {
        "workload": advice.workload,
        "requests": advice.requests,
        "days_seen": advice.days_seen,
        "slo_target": advice.slo_target,
        "recommended": advice.recommended.plan.name,
        "replay": "sampled" if advice.samples else "full",
        "days_replayed": [
            {"date": s.date, "kind": s.kind, "stands_for": list(s.stands_for)} for s in advice.samples
        ],
        "plans": [r.as_json() for r in advice.results],
        "schedule": {
            pool: [
                {
                    "replica": w.replica,
                    "boot_at": w.boot_clock(),
                    "ready_h": w.ready_h,
                    "stop_h": w.stop_h,
                    "boot_s": w.boot_s,
                }
                for w in windows
            ]
            for pool, windows in advice.windows.items()
        },
        "model_replicas_by_hour_of_day": advice.hourly,
        "sensitivity": {
            "traffic_scale": SENSITIVITY,
            **{pool: s._asdict() for pool, s in advice.sensitivity.items()},
        },
        "pools": {
            p.name: {
                "usd_per_hour": p.shape.usd_per_hour,
                "streams_per_replica": p.shape.streams,
                "stream_tokens_per_s": p.shape.stream_tokens_per_s,
                "boot_s": p.boot_s,
                "routes": p.routes,
            }
            for p in advice.pools
        },
    }


def write_plots(advice: Advice, traffic_by_hour_of_day: list[float], out: Path) -> list[Path]:
    """Cost against capacity (one point per plan), and the day's traffic with the schedule over it."""
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    for r in advice.results:
        color = "tab:red" if r is advice.recommended else "tab:blue"
        x = replica_hours_per_day(r, advice.days_seen)
        ax.scatter([x], [r.usd_per_day], color=color, zorder=3)
        ax.annotate(f"{r.plan.name} ({100 * r.slo_attainment:.1f}% SLO)", (x, r.usd_per_day),
                    textcoords="offset points", xytext=(6, 4), fontsize=8)  # fmt: skip
    ax.set_xlabel("GPU replica-hours per day")
    ax.set_ylabel("USD per day (pools by the hour + API tokens)")
    ax.set_title("cost against capacity (red: recommended)", fontsize=10)
    ax.grid(True, alpha=0.3)
    cost = out / "cost-vs-capacity.png"
    fig.tight_layout()
    fig.savefig(cost)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(9, 5), dpi=110)
    hours = list(range(24))
    ax.plot(hours, traffic_by_hour_of_day, color="tab:gray", marker=".", label="requests/s (busiest day)")
    ax.set_xlabel("hour of the day (UTC)")
    ax.set_ylabel("requests per second")
    twin = ax.twinx()
    for pool, replicas in advice.hourly.items():
        twin.step(hours, replicas, where="post", label=f"{pool} replicas")
    twin.set_ylabel("replicas")
    ax.legend(loc="upper left", fontsize=8)
    twin.legend(loc="upper right", fontsize=8)
    ax.set_title("the day's traffic and the capacity the model sizes for it", fontsize=10)
    day = out / "traffic-and-capacity.png"
    fig.tight_layout()
    fig.savefig(day)
    plt.close(fig)
    return [cost, day]


def replica_hours_per_day(r: PlanResult, days: float) -> float:
    paid = sum(s.paid_until_s - s.paid_from_s for reps in r.plan.spells.values() for sp in reps for s in sp)
    return paid / 3600.0 / max(days, 1e-9)
