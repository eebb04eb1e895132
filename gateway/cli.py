"""The ``gateway`` command: serve, check, emulate, demo, spend, keys, simulate.

Each subcommand is a small function; imports of heavy parts happen inside them so that
``gateway check`` or ``gateway emulate`` never load what they do not use.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POLICY = REPO_ROOT / "policies" / "default.yaml"
REAL_DEMO_POLICY = REPO_ROOT / "policies" / "demo-real.yaml"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    # httpx logs every scrape of every backend at INFO: one line per backend per second.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    result: int = args.func(args)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway", description="A cost-aware, OpenAI-compatible LLM gateway."
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="serve the OpenAI-compatible API with a routing policy")
    serve.add_argument("--policy", default=str(DEFAULT_POLICY), help="policy YAML (hot-reloaded on change)")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--open", action="store_true", help="serve without API keys even on a non-loopback address (unsafe)"
    )
    serve.add_argument(
        "--ledger", default=None, help="ledger SQLite file (default: the policy's ledger.path)"
    )
    serve.add_argument(
        "--redis-url",
        default=None,
        help="share budgets, rate limits, circuit state and live stats with other replicas through this "
        "Redis (default: env GATEWAY_REDIS_URL, else the policy's store.redis_url, else in memory)",
    )
    serve.add_argument(
        "--workers", type=int, default=1, help="worker processes on one port; metrics are merged across them"
    )
    serve.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="also serve GET /metrics on this port, without a key (on the API port it needs an admin key)",
    )
    serve.set_defaults(func=cmd_serve)

    keys = sub.add_parser("keys", help="manage client API keys")
    keys_sub = keys.add_subparsers(required=True, metavar="ACTION")
    create = keys_sub.add_parser(
        "create", help="print a new key once, with the line to paste into the policy"
    )
    create.add_argument("name")
    create.add_argument("--routes", default="*", help="comma-separated routes the key may use (default: all)")
    create.add_argument(
        "--admin", action="store_true", help="the key may also use /admin, /dashboard, /metrics"
    )
    create.set_defaults(func=cmd_keys_create)

    spend = sub.add_parser("spend", help="report spend and tokens from the ledger")
    spend.add_argument("--by", default="route", choices=["route", "backend", "key"])
    spend.add_argument("--since", default="24h", help="a span (24h, 30m, 7d) or an ISO date (UTC)")
    spend.add_argument("--format", default="table", choices=["table", "csv", "json"])
    spend.add_argument("--ledger", default="var/ledger.sqlite3", help="the ledger SQLite file")
    spend.add_argument("--policy", default=None, help="a policy, to add GPU-hour pools' idle cost")
    spend.set_defaults(func=cmd_spend)

    check = sub.add_parser("check", help="validate a policy file and print its compiled routes")
    check.add_argument("file")
    check.set_defaults(func=cmd_check)

    emulate = sub.add_parser("emulate", help="run an upstream emulator (vLLM, llama.cpp or paid-API dialect)")
    emulate.add_argument("--profile", required=True, help="b300-vllm, a100-llamacpp or paid-api")
    emulate.add_argument("--host", default="127.0.0.1")
    emulate.add_argument("--port", type=int, required=True)
    emulate.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply every duration (0.01 = 100x faster)"
    )
    emulate.add_argument(
        "--cold-boot", action="store_true", help="start booting: /health fails for the boot time"
    )
    emulate.set_defaults(func=cmd_emulate)

    demo = sub.add_parser(
        "demo", help="start the three emulated backends and the gateway on the default policy"
    )
    demo.add_argument("--port", type=int, default=8080)
    demo.add_argument(
        "--policy", default=None, help="default: policies/default.yaml (demo-real.yaml with --real)"
    )
    demo.add_argument("--time-scale", type=float, default=1.0, help="emulator speed (0.1 = ten times faster)")
    demo.add_argument("--real", action="store_true", help="also serve a real model (Gemma 3 270M, llama.cpp)")
    demo.set_defaults(func=cmd_demo)

    simulate = sub.add_parser(
        "simulate",
        help="replay a workload through policies and baselines in virtual time; report cost and SLO",
    )
    simulate.add_argument("--policy", action="append", required=True, help="a policy YAML; repeat to compare")
    simulate.add_argument("--workload", required=True, help="a workload YAML/JSON file, or ledger:PATH")
    simulate.add_argument(
        "--baseline", action="append", default=[], help="a baseline to compare with (repeat), or 'all'"
    )
    simulate.add_argument(
        "--since", default="24h", help="with ledger:PATH, the window to replay (24h, a date)"
    )
    simulate.add_argument("--out", default="var/simulate", help="directory for report.json and the plots")
    simulate.add_argument("--seed", type=int, default=0, help="seed of the decisions and backend timings")
    simulate.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    simulate.add_argument("--quiet", action="store_true", help="no progress bar")
    simulate.set_defaults(func=cmd_simulate)
    return parser


def cmd_serve(args: argparse.Namespace) -> int:
    from gateway.server import serve

    return serve(
        args.policy,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        allow_open=args.open,
        ledger_path=args.ledger,
        redis_url=args.redis_url or os.environ.get("GATEWAY_REDIS_URL") or None,
        workers=max(1, args.workers),
        metrics_port=args.metrics_port,
    )


def cmd_keys_create(args: argparse.Namespace) -> int:
    from gateway.auth import new_key, policy_line

    routes = [r.strip() for r in args.routes.split(",") if r.strip() and r.strip() != "*"]
    key = new_key()
    print(f"API key for {args.name} (shown once; the gateway stores only its SHA-256):\n\n  {key}\n")
    print("Paste this under auth.keys in the policy:\n")
    print("  " + policy_line(args.name, key, routes=routes, admin=args.admin))
    return 0


def cmd_spend(args: argparse.Namespace) -> int:
    from gateway.spend import spend_main

    return spend_main(args)


def cmd_check(args: argparse.Namespace) -> int:
    from gateway.policy.check import check_main

    return check_main(args.file)


def cmd_emulate(args: argparse.Namespace) -> int:
    from gateway.emulator import PROFILES, run_emulator

    if args.profile not in PROFILES:
        print(f"unknown profile '{args.profile}'; choose one of: {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    run_emulator(
        args.profile, host=args.host, port=args.port, time_scale=args.time_scale, cold_boot=args.cold_boot
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    policy = args.policy or str(REAL_DEMO_POLICY if args.real else DEFAULT_POLICY)
    return run_demo(
        policy, port=args.port, time_scale=args.time_scale, log_level=args.log_level, real=args.real
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    from gateway.simulate.command import simulate_main

    return simulate_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
