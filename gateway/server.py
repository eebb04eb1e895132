"""Runs the gateway under uvicorn (uvloop, httptools) with a hot-reloaded policy file, in one process
or in several worker processes on one port (``--workers``; Prometheus metrics merged across them).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

import uvicorn
from prometheus_client import CollectorRegistry, multiprocess, start_http_server
from uvicorn.supervisors import Multiprocess

from gateway.app import GatewayApp, create_app
from gateway.doors.reasoning_seal import ensure_key
from gateway.ledger.settings import resolve_ledger
from gateway.policy.load import PolicyError
from gateway.policy.reload import PolicyHolder
from gateway.request.connection import ConnectionLimits, guarded_protocol
from gateway.runtime import Runtime
from gateway.runtime.stopping import CONNECTIONS_WAIT_S, StopDeadline
from gateway.store import STORES
from gateway.values.auth import is_loopback
from gateway.values.observation import Observation

log = logging.getLogger("gateway")
WORKER_CONFIG_ENV = "GATEWAY_WORKER_CONFIG"  # how the parent configures each worker process
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
DEFAULT_GRACE_S = 30.0  # how long SIGTERM lets open streams run on (``serve --grace-s``)


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
    request_listener: Callable[[Observation], None] | None = None,
    grace_s: float = DEFAULT_GRACE_S,
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
    if problem := ensure_key():  # before any worker starts, so all of them seal and open with one key
        print(f"gateway: {problem}; nothing started", file=sys.stderr)
        return 2
    public = not is_loopback(host)
    if public and not holder.current.api_keys and not allow_open:
        print(
            f"gateway: refusing to listen on {host} with no API keys in {policy_path}: anyone who can reach\n"
            "this address could spend your GPU hours and paid-API credit. Add keys (`gateway keys create\n"
            "NAME` prints one with the auth block to paste), listen on 127.0.0.1, or pass --open to run\n"
            "open anyway.",
            file=sys.stderr,
        )
        return 2
    require_keys = public and not allow_open
    ledger = resolve_ledger(ledger_path, lambda: holder.current)
    ledger_path = str(ledger.target)
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
            "grace_s": grace_s,
        }
        return _serve_workers(
            worker,
            host=host,
            port=port,
            log_level=log_level,
            workers=workers,
            metrics_port=metrics_port,
            limits=ConnectionLimits.of(holder.current.server),
        )

    def build_runtime() -> Runtime:
        runtime = Runtime(holder, require_keys=require_keys, ledger_path=ledger_path, redis_url=redis_url)
        if request_listener is not None:
            runtime.request_listeners.append(request_listener)
        return runtime

    app = create_app(build_runtime, metrics_port=metrics_port, serving_process=True)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=guarded_protocol(ConnectionLimits.of(holder.current.server)),  # httptools, with header limits
        access_log=False,  # one line per request costs more than the proxying; the ledger records requests
        proxy_headers=False,  # nothing reads the client address: no X-Forwarded-For rewrite per request
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=CONNECTIONS_WAIT_S,  # after the drain: a client that never reads
    )
    try:
        sockets = [bind_listener(host, port)]
        if metrics_port is not None:
            # The same server and event loop listen on a second socket; GatewayApp tells them apart.
            sockets.append(bind_listener(host, metrics_port, "--metrics-port"))
    except PortUnavailable as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    shown = f"[{host}]" if _is_ipv6(host) else host

    def announce() -> None:
        log.info("gateway serving on http://%s:%d/v1 with policy %s", shown, port, policy_path)
        log.info("ledger: %s", ledger)
        if metrics_port is not None:
            log.info("metrics on http://%s:%d/metrics", shown, metrics_port)

    server = AnnouncingServer(config, announce, grace_s=grace_s)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises the signal with the handler that was
    # there before it: make that a clean exit, so callers' cleanup (the demo's children) still runs.
    signal.signal(signal.SIGTERM, _exit_cleanly)
    server.run(sockets=sockets)
    return 0 if server.started else 1


class PortUnavailable(Exception):
    """The address cannot be bound (taken, or not this machine's): one line that names it."""

    def __init__(self, host: str, port: int, error: OSError, flag: str = "--port") -> None:
        reason = (error.strerror or str(error)).lower()
        hint = f"; is another gateway or demo running? pick another with {flag}" if port else ""
        super().__init__(f"cannot listen on {host}:{port}: {reason}{hint}")


def bind_listener(host: str, port: int, flag: str = "--port") -> socket.socket:
    """A listening socket on host:port, as uvicorn would bind it, or ``PortUnavailable``.

    Bound here rather than by uvicorn, whose own bind logs the error and exits the process."""
    family = socket.AF_INET6 if _is_ipv6(host) else socket.AF_INET
    sock = socket.socket(family=family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's default backlog; connections wait here until a worker accepts
    except OSError as exc:
        sock.close()
        raise PortUnavailable(host, port, exc, flag) from None
    sock.set_inheritable(True)
    return sock


class AnnouncingServer(uvicorn.Server):
    """uvicorn's server that says "serving" only once the app has started and the sockets listen, and
    stops gracefully: the first SIGTERM drains (``gateway.runtime.drain``) before uvicorn's own
    shutdown begins; a second one stops at once."""

    def __init__(self, config: uvicorn.Config, announce: Callable[[], None], *, grace_s: float = 0.0) -> None:
        super().__init__(config)
        self._announce = announce
        self._grace_s = grace_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._draining: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets=sockets)
        if self.started and not self.should_exit:
            self._announce()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        state = getattr(self.config.app, "state", None)  # the GatewayApp given, unwrapped
        runtime = getattr(state, "runtime", None)
        if self._draining is not None or self._loop is None or not isinstance(runtime, Runtime):
            super().handle_exit(sig, frame)  # a second signal, or nothing to drain yet
            return
        runtime.drain.draining = True  # /ready fails from this instant, before the loop even runs
        StopDeadline(self._grace_s).arm()  # whatever hangs from here, the process ends in time
        self._loop.call_soon_threadsafe(self._begin_drain, runtime)

    def _begin_drain(self, runtime: Runtime) -> None:
        def exit_now() -> None:
            self.should_exit = True  # uvicorn closes the listeners, then the app: the ledger flushes

        self._draining = drain_then(runtime, self._grace_s, exit_now)


def drain_then(runtime: Runtime, grace_s: float, stop: Callable[[], None]) -> asyncio.Task[None]:
    """Drain (``gateway.runtime.drain``) in the running loop, then ``stop`` the server, however it went."""

    async def drain_then_stop() -> None:
        try:
            await runtime.drain.run(grace_s)
        finally:
            stop()

    return asyncio.get_running_loop().create_task(drain_then_stop())


def _serve_workers(
    worker: Mapping[str, object],
    *,
    host: str,
    port: int,
    log_level: str,
    workers: int,
    metrics_port: int | None = None,
    limits: ConnectionLimits | None = None,
) -> int:
    """uvicorn's supervisor with ``workers`` processes; each builds its own Runtime (``worker_app``)."""
    try:
        sock = bind_listener(host, port)
    except PortUnavailable as exc:
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    given = os.environ.get(METRICS_DIR_ENV)
    metrics_dir = Path(given) if given else Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
    metrics_dir.mkdir(parents=True, exist_ok=True)
    for stale in metrics_dir.glob("*.db"):  # counts from an earlier run would be added to this one's
        stale.unlink()
    os.environ[METRICS_DIR_ENV] = str(metrics_dir)
    os.environ[WORKER_CONFIG_ENV] = json.dumps(worker)
    metrics_server = None
    try:
        if metrics_port is not None:
            # The supervisor serves the workers' merged metrics from their shared directory.
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry, path=str(metrics_dir))  # type: ignore[no-untyped-call]
            try:
                metrics_server, _ = start_http_server(metrics_port, addr=host, registry=registry)
            except OSError as exc:
                print(
                    f"gateway: {PortUnavailable(host, metrics_port, exc, '--metrics-port')}", file=sys.stderr
                )
                return 2
            log.info("metrics on http://%s:%d/metrics", host, metrics_port)
        config = uvicorn.Config(
            "gateway.server:worker_app",
            factory=True,
            workers=workers,
            host=host,
            port=port,
            loop="uvloop",
            http="httptools" if limits is None else guarded_protocol(limits),
            access_log=False,
            proxy_headers=False,
            log_level=log_level,
            lifespan="on",
            timeout_graceful_shutdown=CONNECTIONS_WAIT_S,
        )
        # The socket listens already: connections wait in its backlog until a worker accepts them.
        log.info("gateway serving on http://%s:%d/v1 with %d workers", host, port, workers)
        log.info("ledger: %s", worker["ledger"])
        PromptSupervisor(config, sockets=[sock]).run()
    except KeyboardInterrupt:
        pass
    finally:
        sock.close()
        if metrics_server is not None:
            metrics_server.shutdown()
        if not given:
            shutil.rmtree(metrics_dir, ignore_errors=True)
    return 0


class PromptSupervisor(Multiprocess):
    """uvicorn's supervisor, passing SIGTERM on to its workers at once: its own loop looks at signals
    only every half second, and /ready must fail the moment the pod is told to stop."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket]) -> None:
        super().__init__(config, sockets)
        signal.signal(signal.SIGTERM, self._stop_now)

    def _stop_now(self, sig: int, frame: FrameType | None) -> None:
        self.should_exit.set()  # run() leaves its wait now and sends each worker SIGTERM (WorkerDrain)


def worker_app() -> GatewayApp:
    """One worker's app, configured by its parent (``serve --workers``) through the environment."""
    config = json.loads(os.environ[WORKER_CONFIG_ENV])
    holder = PolicyHolder(config["policy"])
    app = create_app(
        lambda: Runtime(
            holder,
            require_keys=bool(config["require_keys"]),
            ledger_path=config["ledger"],
            redis_url=config["redis_url"],
        ),
        serving_process=True,
    )
    WorkerDrain(app, float(config.get("grace_s", DEFAULT_GRACE_S))).install()
    return app


class WorkerDrain:
    """A worker of ``serve --workers`` stops as the single process does. On SIGTERM uvicorn's supervisor
    (0.54: ``Multiprocess.terminate_all``) sends each worker SIGTERM, and a worker's plain uvicorn
    ``Server`` would close its listener at once and wait for open streams without end, /ready never
    failing and no stream ever told why it ended. This handler takes SIGTERM first: it drains, then hands
    the signal to uvicorn's own handler, whose shutdown closes the app (the ledger flushes).

    Installed from ``worker_app``, which uvicorn calls while loading the app inside ``Server.serve``:
    the loop runs and uvicorn's handler is already the one in place. A second SIGTERM stops at once."""

    def __init__(self, app: GatewayApp, grace_s: float) -> None:
        self._app = app
        self._grace_s = grace_s
        self._uvicorn_exit = signal.getsignal(signal.SIGTERM)
        self._signalled = False
        self._draining: asyncio.Task[None] | None = None  # held: the loop keeps only weak references
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None  # built outside a server (a test, a script): nothing to drain for

    def install(self) -> None:
        if self._loop is not None and callable(self._uvicorn_exit):
            signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, sig: int, frame: FrameType | None) -> None:
        runtime = getattr(self._app.state, "runtime", None)
        if self._signalled or self._loop is None or not isinstance(runtime, Runtime):
            self._pass_on(sig)  # a second signal, or the app has not started: uvicorn stops now
            return
        self._signalled = True
        runtime.drain.draining = True  # /ready fails from this instant
        StopDeadline(self._grace_s).arm()
        self._loop.call_soon_threadsafe(self._begin, runtime, sig)

    def _begin(self, runtime: Runtime, sig: int) -> None:
        self._draining = drain_then(runtime, self._grace_s, lambda: self._pass_on(sig))

    def _pass_on(self, sig: int) -> None:
        exit_handler = self._uvicorn_exit
        if callable(exit_handler):
            exit_handler(sig, None)


def _exit_cleanly(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
