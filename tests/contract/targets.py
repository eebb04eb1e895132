"""What the contract suite runs against: each emulator profile of a dialect, and the real llama-server.

``start(target, **options)`` yields a running server; options are the engine's own switches (``engine_args``,
``environ``), a ``cold_boot`` to watch, and a smaller ``context_tokens`` (emulators only, where a real
context would take a megabyte of prompt).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gateway.emulator import PROFILES, GatedServer, create_emulator_app
from tests.servers import ThreadedServer

REAL_LLAMA = "llama-server"
FAST = 0.001  # emulated seconds to real seconds, when nothing waits on a boot
LOADING_REAL_S = 0.8  # how long a cold-booting emulator loads, in real seconds


@dataclass
class Running:
    url: str
    real: bool
    context_tokens: int | None  # the per-request context limit the server enforces, when known

    def emulator(self, path: str, json: dict[str, Any] | None = None) -> dict[str, Any]:
        """GET (or POST ``json`` to) one of the emulator's control routes."""
        assert not self.real, "control routes exist only on emulators"
        if json is None:
            reply = httpx.get(self.url + path, timeout=10)
        else:
            reply = httpx.post(self.url + path, json=json, timeout=10)
        reply.raise_for_status()
        body: dict[str, Any] = reply.json()
        return body


Start = Callable[..., contextlib.AbstractContextManager[Running]]


def targets_of(dialect: str) -> list[str]:
    names = [name for name, profile in PROFILES.items() if profile.dialect == dialect]
    return names + ([REAL_LLAMA] if dialect == "llamacpp" else [])


@contextlib.contextmanager
def emulator(
    profile_name: str,
    *,
    engine_args: tuple[str, ...] | None = None,
    environ: dict[str, str] | None = None,
    cold_boot: bool = False,
    context_tokens: int | None = None,
) -> Iterator[Running]:
    profile = PROFILES[profile_name]
    if context_tokens is not None:
        profile = profile.with_overrides({"context_tokens": context_tokens})
    time_scale = FAST
    if cold_boot:
        time_scale = LOADING_REAL_S / max(1.0, profile.cold_boot_s - profile.warmup_s)
    app = create_emulator_app(
        profile, time_scale=time_scale, cold_boot=cold_boot, engine_args=engine_args, environ=environ or {}
    )
    server = ThreadedServer(app, server_cls=GatedServer).start()
    try:
        yield Running(server.url, real=False, context_tokens=profile.context_tokens)
    finally:
        server.stop()


@contextlib.contextmanager
def real_llama(
    log_dir: Path,
    *,
    shared: str | None,
    cold_boot: bool = False,
    engine_args: tuple[str, ...] | None = None,
    context_tokens: int | None = None,
    **unsupported: Any,
) -> Iterator[Running]:
    """The shared real server; with ``cold_boot`` a fresh one yielded before it has loaded; with
    ``engine_args`` a fresh one started with them (and ``context_tokens`` per slot), once it has loaded."""
    from tests.real.conftest import CONTEXT_PER_SLOT, start_llama_server, wait_for_boot

    if any(value is not None for value in unsupported.values()):
        raise ValueError(f"the real llama-server takes no {sorted(unsupported)} here")
    if not cold_boot and engine_args is None:
        assert shared is not None
        yield Running(shared, real=True, context_tokens=CONTEXT_PER_SLOT)
        return
    context = context_tokens or CONTEXT_PER_SLOT
    log_path = log_dir / "server.log"
    process, url = start_llama_server(log_path, context_tokens=context, extra_args=engine_args or ())
    try:
        if not cold_boot:
            wait_for_boot(process, url, log_path)
        yield Running(url, real=True, context_tokens=context)
    finally:
        process.stop()
