"""Runs the gateway under uvicorn (uvloop, httptools) with a hot-reloaded policy file, in one process
or in several worker processes on one port (``--workers``; Prometheus metrics merged across them).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import FrameType

import uvicorn
from prometheus_client import CollectorRegistry, multiprocess, start_http_server

from gateway.app import GatewayApp, create_app
from gateway.auth import is_loopback
from gateway.policy.load import PolicyError
from gateway.policy.reload import PolicyHolder
from gateway.runtime import Runtime
from gateway.store import STORES

log = logging.getLogger("gateway")
WORKER_CONFIG_ENV = "GATEWAY_WORKER_CONFIG"  # how the parent configures each worker process
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"


def serve(
    policy_path: str,
    *,
    host: str,
    port: int,
    log_level: str = "info",
    allow_open: bool = False,
    ledger_path: str | None = None,
    redis_url: str | None = None,
    workers: int = 1,
    metrics_port: int | None = None,
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
    if redis_url and redis_url.partition("://")[0].lower() not in STORES:
        print(
            f"gateway: --redis-url must start with one of: {', '.join(f'{s}://' for s in STORES)}",
            file=sys.stderr,
        )
        return 2
    if workers > 1:
        store_url = redis_url or holder.current.store.redis_url or "memory://"
        if store_url.startswith("memory"):
            log.warning(
                "%d workers and no Redis: budgets, rate limits, circuits and live stats are each worker's "
                "own; pass --redis-url to share them",
                workers,
            )
        worker = {
            "policy": policy_path,
            "ledger": ledger_path,
            "redis_url": redis_url,
            "require_keys": require_keys,
        }
        return _serve_workers(
            worker, host=host, port=port, log_level=log_level, workers=workers, metrics_port=metrics_port
        )
    app = create_app(
        lambda: Runtime(holder, require_keys=require_keys, ledger_path=ledger_path, redis_url=redis_url),
        metrics_port=metrics_port,
    )
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
    sockets = [config.bind_socket()]
    if metrics_port is not None:
        # The same server and event loop listen on a second socket; GatewayApp tells them apart.
        sockets.append(uvicorn.Config(app, host=host, port=metrics_port).bind_socket())
        log.info("metrics on http://%s:%d/metrics", shown, metrics_port)
    server.run(sockets=sockets)
    return 0


def _serve_workers(
    worker: Mapping[str, object],
    *,
    host: str,
    port: int,
    log_level: str,
    workers: int,
    metrics_port: int | None = None,
) -> int:
    """uvicorn's supervisor with ``workers`` processes; each builds its own Runtime (``worker_app``)."""
    given = os.environ.get(METRICS_DIR_ENV)
    metrics_dir = Path(given) if given else Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for stale in metrics_dir.glob("*.db"):  # counts from an earlier run would be added to this one's
        stale.unlink()
    os.environ[METRICS_DIR_ENV] = str(metrics_dir)
    os.environ[WORKER_CONFIG_ENV] = json.dumps(worker)
    log.info("gateway serving on http://%s:%d/v1 with %d workers", host, port, workers)
    metrics_server = None
    if metrics_port is not None:
        # The supervisor serves the workers' merged metrics from their shared directory.
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=str(metrics_dir))  # type: ignore[no-untyped-call]
        metrics_server, _ = start_http_server(metrics_port, addr=host, registry=registry)
        log.info("metrics on http://%s:%d/metrics", host, metrics_port)
    try:
        uvicorn.run(
            "gateway.server:worker_app",
            factory=True,
            workers=workers,
            host=host,
            port=port,
            loop="uvloop",
            http="httptools",
            access_log=False,
            log_level=log_level,
            lifespan="on",
        )
    finally:
        if metrics_server is not None:
            metrics_server.shutdown()
        if not given:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


def worker_app() -> GatewayApp:
    """One worker's app, configured by its parent (``serve --workers``) through the environment."""
    config = json.loads(os.environ[WORKER_CONFIG_ENV])
    holder = PolicyHolder(config["policy"])
    return create_app(
        lambda: Runtime(
            holder,
            require_keys=bool(config["require_keys"]),
            ledger_path=config["ledger"],
            redis_url=config["redis_url"],
        )
    )


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
