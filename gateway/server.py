"""Runs the gateway under uvicorn (uvloop, httptools) with a hot-reloaded policy file."""

from __future__ import annotations

import ipaddress
import logging
import signal
import sys
from types import FrameType

import uvicorn

from gateway.app import create_app
from gateway.auth import is_loopback
from gateway.policy.load import PolicyError
from gateway.policy.reload import PolicyHolder
from gateway.runtime import Runtime

log = logging.getLogger("gateway")


def serve(
    policy_path: str,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    allow_open: bool = False,
    ledger_path: str | None = None,
) -> int:
    try:
        holder = PolicyHolder(policy_path)
    except PolicyError as exc:
        print(f"gateway: the policy does not load, nothing started:\n{exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"gateway: cannot read the policy: {exc}", file=sys.stderr)
        return 2
    for warning in holder.current.warnings:
        log.warning("policy warning: %s", warning)
    public = not is_loopback(host)
    if public and not holder.current.api_keys and not allow_open:
        print(
            f"gateway: refusing to listen on {host} with no API keys in {policy_path}: anyone who can reach\n"
            "this address could spend your GPU hours and paid-API credit. Add keys (`gateway keys create\n"
            "NAME` prints one with its policy line), listen on 127.0.0.1, or pass --open to run open anyway.",
            file=sys.stderr,
        )
        return 2
    require_keys = public and not allow_open
    app = create_app(lambda: Runtime(holder, require_keys=require_keys, ledger_path=ledger_path))
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        access_log=False,  # one line per request costs more than the proxying; the ledger records requests
        log_level=log_level,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal with the handler that was
    # there before it: make that a clean exit, so callers' cleanup (the demo's children) still runs.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    shown = f"[{host}]" if _is_ipv6(host) else host
    log.info("gateway serving on http://%s:%d/v1 with policy %s", shown, port, policy_path)
    server.run()
    return 0


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
