"""What each ``gateway`` subcommand does (``cli.py`` is what each accepts): a small function per command.
Imports of heavy parts happen inside them, so that ``gateway check`` or ``gateway emulate`` never load
what they do not use.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POLICY = REPO_ROOT / "policies" / "default.yaml"
REAL_DEMO_POLICY = REPO_ROOT / "policies" / "demo-real.yaml"


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
        grace_s=max(0.0, args.grace_s),
    )


def cmd_keys_create(args: argparse.Namespace) -> int:
    from gateway.keys import create_key

    routes = [r.strip() for r in args.routes.split(",") if r.strip() and r.strip() != "*"]
    print(create_key(args.name, routes, args.admin), end="")
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    from gateway.keys import list_keys

    return list_keys(args.policy)


def cmd_spend(args: argparse.Namespace) -> int:
    from gateway.money.spend import spend_main

    return spend_main(args, str(DEFAULT_POLICY))


def cmd_ledger_migrate(args: argparse.Namespace) -> int:
    from gateway.ledger.migrate import migrate_main

    return migrate_main(args.ledger, args.policy)


def cmd_ledger_prune(args: argparse.Namespace) -> int:
    from gateway.money.retention import prune_main

    return prune_main(args.ledger, args.policy, args.before, args.dry_run)


def cmd_check(args: argparse.Namespace) -> int:
    from gateway.policy.check import check_main

    return check_main(args.file, live=args.live)


def cmd_emulate(args: argparse.Namespace) -> int:
    import shlex

    from gateway.emulator import PROFILES, run_emulator

    if args.profile not in PROFILES:
        print(f"unknown profile '{args.profile}'; choose one of: {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    engine_args = None if args.engine_args is None else tuple(shlex.split(args.engine_args))
    run_emulator(
        args.profile,
        host=args.host,
        port=args.port,
        time_scale=args.time_scale,
        cold_boot=args.cold_boot,
        engine_args=engine_args,
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from gateway.demo import run_demo

    policy = args.policy or str(REAL_DEMO_POLICY if args.real else DEFAULT_POLICY)
    return run_demo(
        policy,
        port=args.port,
        time_scale=args.time_scale,
        log_level=args.log_level,
        real=args.real,
        quiet=args.quiet,
    )


def cmd_advise(args: argparse.Namespace) -> int:
    from gateway.advise.command import advise_main

    return advise_main(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    from gateway.simulate.command import simulate_main

    return simulate_main(args)
