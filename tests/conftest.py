"""Fixtures that start real servers: the three upstream emulators and the gateway, on loopback ports."""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import native
from gateway.app import create_app
from gateway.emulator import create_emulator_app
from gateway.policy.reload import PolicyHolder
from gateway.request.connection import ConnectionLimits, guarded_protocol
from gateway.runtime import Runtime
from tests.postgres import scratch_database, url_of
from tests.servers import ThreadedServer, threaded_server

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A ``pure_python`` test looks inside a module gateway/native.py compiles (it traces its lines,
    patches a method, subclasses a class): with the compiled modules in use it is skipped here, and
    tests/check.sh runs it again with ``GATEWAY_NATIVE=off``, on the .py files."""
    if not native.state.startswith("compiled"):
        return
    skip = pytest.mark.skip(
        reason=f"looks inside a compiled module ({native.state}): run with GATEWAY_NATIVE=off"
    )
    for item in items:
        if "pure_python" in item.keywords:
            item.add_marker(skip)


# Emulated time runs 50x faster than real time: a 1 s TTFT takes 20 ms.
TIME_SCALE = 0.02
PAID_KEY = "paid-backend-secret"


@dataclass
class Upstreams:
    vllm: ThreadedServer
    llamacpp: ThreadedServer
    paid: ThreadedServer

    def all(self) -> dict[str, ThreadedServer]:
        return {"b300-vllm": self.vllm, "a100-llamacpp": self.llamacpp, "paid-api": self.paid}

    def reset(self) -> None:
        for server in self.all().values():
            httpx.delete(server.url + "/emulator/faults")
            httpx.delete(server.url + "/emulator/requests")


@contextlib.contextmanager
def emulated_upstreams(time_scale: float) -> Iterator[Upstreams]:
    """The three emulated backends on loopback ports; the paid API checks the backend key."""
    os.environ["EMULATOR_API_KEY"] = PAID_KEY
    paid_app = create_emulator_app("paid-api", time_scale=time_scale)
    del os.environ["EMULATOR_API_KEY"]
    with (
        threaded_server(create_emulator_app("b300-vllm", time_scale=time_scale)) as vllm,
        threaded_server(create_emulator_app("a100-llamacpp", time_scale=time_scale)) as llamacpp,
        threaded_server(paid_app) as paid,
    ):
        yield Upstreams(vllm, llamacpp, paid)


@pytest.fixture(scope="session")
def upstreams() -> Iterator[Upstreams]:
    with emulated_upstreams(TIME_SCALE) as up:
        yield up


def policy_yaml(up: Upstreams, routes: str | None = None) -> str:
    """A policy over the emulators; ``routes`` replaces the default routes section."""
    default_routes = """
  kimi-k3:
    backends: [b300-vllm, paid-api, a100-llamacpp]
  vllm-only:
    backends: [b300-vllm]
  llamacpp-only:
    backends: [a100-llamacpp]
    fallback: {max_attempts: 1}
  paid-only:
    backends: [paid-api]
  pool-then-api:
    backends: [b300-vllm, paid-api]
    exploration: 0
"""
    return f"""
backends:
  b300-vllm:
    dialect: vllm
    url: {up.vllm.url}/v1
    model: moonshotai/Kimi-K3
    thinking: mandatory
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal}}}}
    signals: {{metrics_url: {up.vllm.url}/metrics, health_url: {up.vllm.url}/health}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}
  a100-llamacpp:
    dialect: llamacpp
    url: {up.llamacpp.url}/v1
    model: kimi-k3-ud-iq1_s
    thinking: mandatory
    max_concurrency: 4
    pricing: {{gpu_hours: {{usd_per_hour: 20.09}}}}
    signals:
      metrics_url: {up.llamacpp.url}/metrics
      slots_url: {up.llamacpp.url}/slots
      health_url: {up.llamacpp.url}/health
    timeouts: {{first_byte_s: 5, idle_s: 2}}
  paid-api:
    dialect: openai
    url: {up.paid.url}/v1
    model: kimi-k3
    api_key_env: TEST_PAID_API_KEY
    thinking: mandatory
    pricing:
      per_token: {{input_usd_per_mtok: 0.6, cached_input_usd_per_mtok: 0.15, output_usd_per_mtok: 15}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}
routes:{routes or default_routes}
"""


@dataclass
class Gateway:
    server: ThreadedServer
    policy_path: Path

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def base_url(self) -> str:
        return self.server.url + "/v1"

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.server.server.config.app.state.runtime  # type: ignore[attr-defined]
        return runtime


@contextlib.contextmanager
def running_gateway(policy_path: Path, **runtime_options: Any) -> Iterator[Gateway]:
    """The gateway in-process on a loopback port, serving (and watching) ``policy_path``; its ledger
    goes beside the policy (a test's tmp dir) unless the test says otherwise."""
    runtime_options.setdefault("ledger_path", policy_path.parent / "ledger.sqlite3")
    holder = PolicyHolder(policy_path)
    app = create_app(lambda: Runtime(holder, **runtime_options))
    # On the connection protocol `gateway serve` runs (its limits, its response cycle, its ClientWatch).
    with threaded_server(app, http=guarded_protocol(ConnectionLimits.of(holder.current.server))) as server:
        yield Gateway(server, policy_path)


def emulated_clock(time_scale: float) -> Callable[[], float]:
    """The gateway's clock in the emulators' time: with time_scale 0.02 one real second is fifty."""
    return lambda: time.monotonic() / time_scale


@contextlib.contextmanager
def measured_gateway(policy_path: Path, ledger: Path, time_scale: float) -> Iterator[Gateway]:
    """The gateway in the emulators' time with a seeded rng (the benchmarks compare runs), handed over
    once its start-up probes have measured every backend, as a deployment's ``/ready`` waits for them."""
    options = {"clock": emulated_clock(time_scale), "rng": random.Random(7), "ledger_path": ledger}
    with running_gateway(policy_path, **options) as gateway:
        wait_for_start_up_probes(gateway)
        yield gateway


def wait_for_start_up_probes(gateway: Gateway, within_s: float = 30.0) -> None:
    """Until the gateway's start-up probes have answered (at most ``within_s``): a first request sent
    sooner can find one candidate measured and another not, and a measured one outranks the unmeasured."""
    deadline = time.monotonic() + within_s
    while not gateway.runtime.probes.idle and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.fixture
def gateway(upstreams: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    upstreams.reset()
    monkeypatch.setenv("TEST_PAID_API_KEY", PAID_KEY)
    path = tmp_path / "policy.yaml"
    path.write_text(policy_yaml(upstreams))
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    with scratch_database() as name:
        yield name


@pytest.fixture
def postgres_url(postgres_database: str) -> Iterator[str]:
    """The run's database, emptied for each test."""
    import psycopg

    url = url_of(postgres_database)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS requests, probes, schema_migrations, spend_rollup, ledger_pruned")
        conn.execute("DROP FUNCTION IF EXISTS spend_rollup_add")
    yield url
