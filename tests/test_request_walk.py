"""gateway/README.md follows one streamed request through the code, module by module, in the order it
enters them. This holds that list to the code: every module it names exists, and a real streamed
request through the gateway (in-process, against the bundled vLLM emulator) enters exactly those
gateway modules, first in that order.

The walk is read with a profiler on the gateway's event-loop thread, counting the request's own task and
the network callbacks (where the relay writes a stream); the process's background tasks (the policy
watch, metrics, the ledger view) are left out, and the policy has no signal URLs and no probes, so
nothing else runs beside the request. The second of two identical requests is the one followed: the
first pays for what a running gateway has already done (dialing the upstream, first imports).
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import pytest

from tests.conftest import Gateway, Upstreams, running_gateway

PACKAGE = Path(__file__).resolve().parent.parent / "gateway"
README = PACKAGE / "README.md"
HELLO = [{"role": "user", "content": "Say hello"}]


def walk_in_readme() -> list[str]:
    """The numbered list under the README's walk heading: each item opens with the module's path."""
    text = README.read_text(encoding="utf-8")
    section = text.split("## One streamed request, module by module", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\d+\. `([\w/]+\.py)`", section, flags=re.MULTILINE)


def module_of(path: str) -> str:
    parts = path.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(["gateway", *parts])


def test_every_module_the_walk_names_exists() -> None:
    named = walk_in_readme()
    assert len(named) >= 10, "the README's walk is missing or unreadable"
    missing = [path for path in named if not (PACKAGE / path).is_file()]
    assert not missing, f"gateway/README.md names modules that do not exist: {missing}"
    repeated = sorted({path for path in named if named.count(path) > 1})
    assert not repeated, f"each module is listed once, where the request first enters it: {repeated}"


@pytest.fixture
def quiet_gateway(upstreams: Upstreams, tmp_path: Path) -> Iterator[Gateway]:
    """One pool, no signal scraping and no probes: nothing but the request runs on the loop."""
    upstreams.reset()
    path = tmp_path / "policy.yaml"
    path.write_text(
        f"""
backends:
  b300-vllm:
    dialect: vllm
    url: {upstreams.vllm.url}/v1
    model: moonshotai/Kimi-K3
    pricing: {{gpu_hours: {{usd_per_hour: 62.93, accounting: marginal}}}}
    timeouts: {{first_byte_s: 5, idle_s: 2}}
routes:
  chat:
    backends: [b300-vllm]
tuning:
  probes: {{enabled: false}}
"""
    )
    with running_gateway(path) as gateway:
        yield gateway
    upstreams.reset()


def loop_of(gateway: Gateway) -> asyncio.AbstractEventLoop:
    loop: asyncio.AbstractEventLoop = gateway.server.server.servers[0].get_loop()
    return loop


def modules_entered(gateway: Gateway, body: dict[str, Any]) -> list[str]:
    """The gateway modules one request enters, each once, in the order of its first entry."""
    loop = loop_of(gateway)
    entered: dict[str, None] = {}
    background: set[asyncio.Task[Any]] = set()

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("gateway.") or name in entered:
            return
        if asyncio.current_task(loop) not in background:
            entered[name] = None

    def switch(on: bool, done: threading.Event) -> None:
        background.update(asyncio.all_tasks(loop))
        sys.setprofile(profile if on else None)
        done.set()

    settled_before = len(gateway.runtime.recent)
    installed, removed = threading.Event(), threading.Event()
    loop.call_soon_threadsafe(switch, True, installed)
    assert installed.wait(10)
    try:
        response = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
        assert response.status_code == 200, response.text
        assert response.text.rstrip().endswith("data: [DONE]")
        settled = threading.Event()
        # A stream settles after its last byte: wait on the loop until it has, then stop profiling.
        deadline = loop.time() + 10

        def when_settled() -> None:
            if len(gateway.runtime.recent) > settled_before:
                settled.set()
            elif loop.time() < deadline:
                loop.call_later(0.01, when_settled)

        loop.call_soon_threadsafe(when_settled)
        assert settled.wait(15), "the request was not settled"
    finally:
        loop.call_soon_threadsafe(switch, False, removed)
        assert removed.wait(10)
    return list(entered)


def wait_until_tasks_end(gateway: Gateway, before: set[asyncio.Task[Any]]) -> None:
    """Wait until every task the loop started since ``before`` was taken has ended.

    A stream is answered at its [DONE], but its task goes on reading the upstream's last bytes (the
    chunked body's end); on a loaded machine those can arrive after the next request's profiling began,
    and the network callback that reads them would be counted as that request's."""
    loop = loop_of(gateway)
    deadline = time.monotonic() + 15
    while asyncio.run_coroutine_threadsafe(_tasks(), loop).result(10) - before:
        assert time.monotonic() < deadline, "the first request's task did not end"
        time.sleep(0.01)


async def _tasks() -> set[asyncio.Task[Any]]:
    current = asyncio.current_task()
    return {task for task in asyncio.all_tasks() if task is not current}


@pytest.mark.pure_python  # sees the modules a request enters by their Python frames: compiled ones have none
def test_a_streamed_request_enters_the_modules_the_readme_lists_in_that_order(quiet_gateway: Gateway) -> None:
    body = {"model": "chat", "messages": HELLO, "stream": True}
    before = asyncio.run_coroutine_threadsafe(_tasks(), loop_of(quiet_gateway)).result(10)
    httpx.post(quiet_gateway.base_url + "/chat/completions", json=body, timeout=30).raise_for_status()
    wait_until_tasks_end(quiet_gateway, before)
    entered = modules_entered(quiet_gateway, body)
    listed = [module_of(path) for path in walk_in_readme()]
    assert listed == entered, (
        "gateway/README.md's walk no longer matches the code; a streamed request enters, in order:\n"
        + "\n".join(entered)
    )
