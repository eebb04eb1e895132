"""The ``gateway`` command: serve, check, emulate, demo, keys, spend, ledger, simulate, advise; ``--help`` on
each shows its defaults and examples.

This module is what each command accepts (the parser, with its help and examples); what each one does is
a small function in ``commands.py``.
"""

from __future__ import annotations

import argparse
import logging

from gateway import native
from gateway.commands import (
    DEFAULT_POLICY,
    cmd_advise,
    cmd_check,
    cmd_demo,
    cmd_emulate,
    cmd_keys_create,
    cmd_keys_list,
    cmd_ledger_migrate,
    cmd_ledger_prune,
    cmd_serve,
    cmd_simulate,
    cmd_spend,
)
from gateway.version import gateway_version

LEDGER_ENV = "GATEWAY_LEDGER"
# gateway.emulator.profiles.PROFILES, named here so --help stays light (a test keeps them equal).
EMULATOR_PROFILES = (
    "b300-vllm",
    "a100-llamacpp",
    "paid-api",
    "h200-sglang",
    "anthropic-api",
)  # gateway.ledger.settings reads it; named here so --help stays light


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


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Each option's default after its help, and examples (the epilog) printed as written. An option
    without a fixed default (None) or a flag says in its help what happens without it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False:
            return action.help
        return super()._get_help_string(action)


def examples(*lines: str) -> str:
    return "examples:\n" + "\n".join(f"  {line}" for line in lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gateway",
        description="A cost-aware, OpenAI-compatible LLM gateway.",
        formatter_class=HelpFormatter,
        epilog=examples(
            "gateway demo                      # emulated backends + the gateway on :8080",
            "gateway serve --policy my.yaml    # your own policy",
            "gateway COMMAND --help            # each command's options, defaults and examples",
        ),
    )
    parser.add_argument("--version", action="version", version=f"gateway {gateway_version()}, {native.state}")
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log verbosity"
    )
    sub = parser.add_subparsers(required=True, metavar="COMMAND")

    def command(name: str, help: str, *example_lines: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name, help=help, description=help, formatter_class=HelpFormatter, epilog=examples(*example_lines)
        )

    serve = command(
        "serve",
        "serve the OpenAI-compatible API with a routing policy",
        "gateway serve --policy policies/default.yaml --port 8080",
        "gateway serve --policy prod.yaml --host 0.0.0.0 --workers 4 --redis-url redis://127.0.0.1:6379/0",
        "gateway serve --policy prod.yaml --ledger /var/lib/gateway/ledger.sqlite3 --metrics-port 9464",
    )
    serve.add_argument("--policy", default=str(DEFAULT_POLICY), help="policy YAML (hot-reloaded on change)")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on")
    serve.add_argument("--port", type=int, default=8080, help="port to listen on")
    serve.add_argument(
        "--open", action="store_true", help="serve without API keys even on a non-loopback address (unsafe)"
    )
    serve.add_argument(
        "--grace-s",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="on SIGTERM, how long open streams may run on after /ready starts failing (default 30); "
        "streams still open then end with an SSE error event",
    )
    serve.add_argument(
        "--ledger",
        default=None,
        help=f"a SQLite file or a postgresql:// URL (default: ${LEDGER_ENV}, else the policy's ledger.url, "
        "else its ledger.path, relative to the current folder)",
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

    keys = command(
        "keys",
        "manage client API keys",
        "gateway keys create ci-bot --routes kimi-k3",
        "gateway keys list --policy prod.yaml",
    )
    keys_sub = keys.add_subparsers(required=True, metavar="ACTION")
    create = keys_sub.add_parser(
        "create",
        help="print a new key once, with the policy's auth block to paste",
        description="Print a new key once, with the YAML `auth:` block to paste into the policy; the "
        "policy stores only the key's SHA-256.",
        formatter_class=HelpFormatter,
        epilog=examples(
            "gateway keys create alice                       # all routes",
            "gateway keys create ci-bot --routes kimi-k3,batch",
            "gateway keys create ops --admin                 # also /admin, /dashboard, /metrics",
        ),
    )
    create.add_argument("name", help="who holds the key (letters, digits, . _ @ -)")
    create.add_argument("--routes", default="*", help="comma-separated routes the key may use (*: all)")
    create.add_argument(
        "--admin", action="store_true", help="the key may also use /admin, /dashboard, /metrics"
    )
    create.set_defaults(func=cmd_keys_create)
    listing = keys_sub.add_parser(
        "list",
        help="list a policy's keys: names, routes, admin, rate limits, budgets",
        description="List a policy's keys: names, routes, admin, rate limits and budgets; digests are "
        "shown only by their first characters.",
        formatter_class=HelpFormatter,
        epilog=examples("gateway keys list", "gateway keys list --policy prod.yaml"),
    )
    listing.add_argument("--policy", default=str(DEFAULT_POLICY), help="the policy whose keys to list")
    listing.set_defaults(func=cmd_keys_list)

    spend = command(
        "spend",
        "report spend and tokens from the ledger",
        "gateway spend                                   # by route, last 24 h, the ledger serve writes",
        "gateway spend --by backend --since 7d --policy policies/default.yaml   # with pools' idle cost",
        "gateway spend --by key --since 2026-06-01 --format csv --ledger /var/lib/gateway/ledger.sqlite3",
        "gateway spend --by replica --ledger postgresql://gateway@db/gateway   # the fleet's shared ledger",
        "gateway spend --by user --since 7d     # per user, with ledger.user: hashed (keyed hashes, no ids)",
    )
    spend.add_argument(
        "--by", default="route", choices=["route", "backend", "key", "replica", "user"], help="one row per"
    )
    spend.add_argument("--since", default="24h", help="a span (24h, 30m, 7d) or an ISO date (UTC)")
    spend.add_argument("--format", default="table", choices=["table", "csv", "json"], help="output format")
    spend.add_argument(
        "--ledger",
        default=None,
        help=f"a SQLite file or a postgresql:// URL (default: found as serve finds it: ${LEDGER_ENV}, else "
        "the policy's ledger.url or ledger.path, relative to the current folder)",
    )
    spend.add_argument(
        "--policy",
        default=None,
        help="a policy, to add GPU-hour pools' idle cost and to find the ledger (default: "
        "policies/default.yaml for the ledger, no idle cost)",
    )
    spend.set_defaults(func=cmd_spend)

    ledger = command(
        "ledger",
        "manage the ledger database",
        "gateway ledger migrate                          # the ledger serve would write",
        "gateway ledger migrate --ledger postgresql://gateway@db/gateway",
        "gateway ledger prune --before 90d               # keep 90 days of rows; totals stay whole",
    )
    ledger_sub = ledger.add_subparsers(required=True, metavar="ACTION")
    migrate = ledger_sub.add_parser(
        "migrate",
        help="create the ledger or bring its schema to this version (serve does it at start-up too)",
        description="Create the ledger or bring its schema to the version this gateway ships, and say "
        "which migrations were applied.",
        formatter_class=HelpFormatter,
        epilog=examples("gateway ledger migrate --ledger postgresql://gateway@db/gateway"),
    )
    ledger_arguments(migrate)
    migrate.set_defaults(func=cmd_ledger_migrate)
    prune = ledger_sub.add_parser(
        "prune",
        help="delete request rows older than a date; spend reports keep their totals (hourly rollup)",
        description="Delete the request rows that started before the hour holding --before. Their spend "
        "stays in the ledger's hourly rollup, checked against the rows first, so `gateway spend` and the "
        "dashboard report the same totals after as before (a window starting inside the pruned span "
        "counts its first hour whole).",
        formatter_class=HelpFormatter,
        epilog=examples(
            "gateway ledger prune --before 90d",
            "gateway ledger prune --before 2026-01-01 --ledger postgresql://gateway@db/gateway --dry-run",
        ),
    )
    prune.add_argument("--before", required=True, help="a span ago (90d, 12w) or an ISO date (UTC)")
    prune.add_argument("--dry-run", action="store_true", help="count the rows it would delete, delete none")
    ledger_arguments(prune)
    prune.set_defaults(func=cmd_ledger_prune)

    check = command(
        "check",
        "validate a policy file and print its compiled routes; --live asks every backend about itself",
        "gateway check policies/default.yaml",
        "gateway check prod.yaml && kubectl apply -f configmap.yaml",
        "gateway check --live policies/real-pools.yaml   # first thing to run against real pools",
    )
    check.add_argument("file", help="the policy YAML to validate")
    check.add_argument(
        "--live",
        action="store_true",
        help="also probe each backend from here: reachable, TLS, model listed, load signals, health, "
        "cached-token reporting, continuation, one-token TTFT; exit 1 when one a route needs is unusable",
    )
    check.set_defaults(func=cmd_check)

    emulate = command(
        "emulate",
        "run an upstream emulator (vLLM, llama.cpp or paid-API dialect)",
        "gateway emulate --profile b300-vllm --port 8101",
        "gateway emulate --profile a100-llamacpp --port 8102 --time-scale 0.1 --cold-boot",
        "gateway emulate --profile b300-vllm --port 8101 --engine-args ''   # no cached-token details",
    )
    emulate.add_argument("--profile", required=True, choices=EMULATOR_PROFILES, help="which upstream")
    emulate.add_argument("--host", default="127.0.0.1", help="address to listen on")
    emulate.add_argument("--port", type=int, required=True, help="port to listen on")
    emulate.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply every duration (0.01 = 100x faster)"
    )
    emulate.add_argument(
        "--cold-boot",
        action="store_true",
        help="start booting: vLLM and SGLang refuse connections while they load, llama-server answers 503",
    )
    emulate.add_argument(
        "--engine-args",
        default=None,
        help="the engine flags that change what it reports, replacing the profile's (the deploy recipe's), "
        "e.g. '--enable-prompt-tokens-details' (vLLM) or '--enable-cache-report' (SGLang)",
    )
    emulate.set_defaults(func=cmd_emulate)

    demo = command(
        "demo",
        "start the three emulated backends and the gateway on the default policy",
        "gateway demo",
        "gateway demo --port 9090 --time-scale 0.1   # another port, emulators ten times faster",
        "gateway demo --quiet                        # no line per request",
        "gateway demo --real                         # also a real Gemma 3 270M on llama.cpp",
    )
    demo.add_argument("--port", type=int, default=8080, help="the gateway's port")
    demo.add_argument(
        "--policy",
        default=None,
        help="the policy (default: policies/default.yaml, demo-real.yaml with --real)",
    )
    demo.add_argument("--time-scale", type=float, default=1.0, help="emulator speed (0.1 = ten times faster)")
    demo.add_argument("--real", action="store_true", help="also serve a real model (Gemma 3 270M, llama.cpp)")
    demo.add_argument("--quiet", action="store_true", help="no line per request")
    demo.set_defaults(func=cmd_demo)

    simulate = command(
        "simulate",
        "replay a workload through policies and baselines in virtual time; report cost and SLO",
        "gateway simulate --policy policies/default.yaml --workload bench/workloads/kimi-day.yaml "
        "--baseline all",
        "gateway simulate --policy a.yaml --policy b.yaml --workload ledger:var/ledger.sqlite3 --since 24h",
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

    advise = command(
        "advise",
        "what capacity to run: replay traffic for candidate replicas of each pool and recommend the cheapest "
        "plan within the SLO",
        "gateway advise --policy policies/default.yaml --workload bench/workloads/kimi-week.yaml",
        "gateway advise --ledger var/ledger.sqlite3 --since 7d",
    )
    traffic = advise.add_mutually_exclusive_group(required=True)
    traffic.add_argument("--ledger", help="the ledger to replay: a SQLite path or a postgresql:// URL")
    traffic.add_argument("--workload", help="a synthetic workload YAML/JSON file instead of the ledger")
    advise.add_argument("--since", default="7d", help="how much of the ledger to replay (e.g. 24h, 7d)")
    advise.add_argument("--policy", default=str(DEFAULT_POLICY), help="the policy whose pools are sized")
    advise.add_argument(
        "--slo", type=float, default=0.99, help="the share of requests that must meet their route's SLO"
    )
    advise.add_argument(
        "--max-replicas", type=int, help="most replicas per pool to consider (default: policy)"
    )
    advise.add_argument("--out", default="var/advise", help="directory for advice.json and the plots")
    advise.add_argument("--seed", type=int, default=0, help="seed of the decisions and backend timings")
    advise.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    advise.add_argument("--quiet", action="store_true", help="no progress lines")
    advise.add_argument(
        "--full-replay",
        action="store_true",
        help="replay every day (runs over a week replay a sample of days by default)",
    )
    advise.set_defaults(func=cmd_advise)
    return parser


def ledger_arguments(parser: argparse.ArgumentParser) -> None:
    """``--ledger`` and ``--policy``, as every ``gateway ledger`` command finds its ledger."""
    parser.add_argument(
        "--ledger",
        default=None,
        help=f"a SQLite file or a postgresql:// URL (default: as serve finds it: ${LEDGER_ENV}, else "
        "the policy's)",
    )
    parser.add_argument("--policy", default=str(DEFAULT_POLICY), help="the policy that names the ledger")


if __name__ == "__main__":
    raise SystemExit(main())
