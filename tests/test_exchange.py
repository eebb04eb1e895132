"""One request, one object: a policy reload mid-request never breaks it, and a client that leaves at
any stage (waiting for the first token, for a whole answer, or mid-stream) frees its upstream slot."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway.request import proxy as request_path
from gateway.request.exchange import Exchange
from tests.conftest import Gateway, Upstreams, policy_yaml
from tests.spend.conftest import ledger_rows

HELLO = [{"role": "user", "content": "Say hello"}]


def eventually(condition: Callable[[], bool], within: float, what: str) -> float:
    """Poll ``condition``; returns the seconds it took, fails after ``within``."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > within:
            raise AssertionError(f"not within {within}s: {what}")
        time.sleep(0.01)
    return time.monotonic() - started


def set_faults(server: Any, **faults: Any) -> None:
    httpx.post(server.url + "/emulator/faults", json=faults).raise_for_status()


def renamed_policy(upstreams: Upstreams) -> str:
    """The same upstreams, but the B300 backend renamed and every route the tests use removed."""
    text = policy_yaml(upstreams, routes="\n  elsewhere:\n    backends: [paid-api]\n")
    return text.replace("  b300-vllm:\n", "  b300-renamed:\n", 1)


# -- a reload while a request is in flight --------------------------------------------------------


@pytest.fixture
def reload_inside_the_exchange(
    gateway: Gateway, upstreams: Upstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every exchange, the moment it has taken its policy snapshot, reloads a policy in which its
    route and backend no longer exist: any later read of the live policy would see that one."""
    renamed = renamed_policy(upstreams)

    class ReloadingExchange(Exchange):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            gateway.policy_path.write_text(renamed)
            assert gateway.runtime.policy_source.reload_now()  # type: ignore[attr-defined]
            assert self.policy.digest != gateway.runtime.policy.digest

    monkeypatch.setattr(request_path, "Exchange", ReloadingExchange)


@pytest.mark.usefixtures("reload_inside_the_exchange")
@pytest.mark.parametrize("stream", [False, True])
def test_a_request_completes_on_the_policy_it_started_with(gateway: Gateway, stream: bool) -> None:
    body = {"model": "vllm-only", "messages": HELLO, "stream": stream}
    response = httpx.post(gateway.base_url + "/chat/completions", json=body, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["x-gateway-backend"] == "b300-vllm"
    if stream:
        assert response.text.rstrip().endswith("data: [DONE]")
    eventually(lambda: len(gateway.runtime.recent) == 1, 5, "the request is settled")  # a stream, at its end
    observation = gateway.runtime.recent[-1]
    assert observation.status == "ok" and observation.backend == "b300-vllm"
    assert observation.cost_usd is not None and observation.cost_usd > 0, "priced on its own snapshot"


def test_a_request_with_a_budget_settles_on_its_snapshot(
    gateway: Gateway, upstreams: Upstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reservation and settlement use the snapshot too: the capped route is gone from the live policy."""
    capped = "\n  capped:\n    backends: [paid-api]\n    budgets: {per_day_usd: 100}\n"
    gateway.policy_path.write_text(policy_yaml(upstreams, routes=capped))
    assert gateway.runtime.policy_source.reload_now()  # type: ignore[attr-defined]
    renamed = renamed_policy(upstreams)

    class ReloadingExchange(Exchange):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            gateway.policy_path.write_text(renamed)
            gateway.runtime.policy_source.reload_now()  # type: ignore[attr-defined]

    monkeypatch.setattr(request_path, "Exchange", ReloadingExchange)
    response = httpx.post(
        gateway.base_url + "/chat/completions", json={"model": "capped", "messages": HELLO}, timeout=30
    )
    assert response.status_code == 200, response.text
    runtime = gateway.runtime
    (day,) = [
        use
        for use in runtime.budgets.usage(runtime.policy_source.current, runtime.wall_clock())  # type: ignore[attr-defined]
        if use.name == "capped" and use.period == "day"
    ] or [None]
    assert day is None, "the live policy has no cap named 'capped' any more"
    observation = runtime.recent[-1]
    assert observation.status == "ok" and (observation.cost_usd or 0) > 0


def _reload(gateway: Gateway, text: str) -> None:
    gateway.policy_path.write_text(text)
    response = httpx.post(gateway.url + "/admin/policy/reload", timeout=10)
    assert response.status_code == 200 and response.headers["x-gateway-policy-changed"] == "true"


@pytest.mark.parametrize(
    ("stage", "stream"),
    [
        ("sending its body", False),
        ("waiting for the first token", True),
        ("mid-stream", True),
        ("waiting for the whole answer", False),
    ],
)
def test_a_reload_at_each_stage_of_a_request_leaves_it_alone(
    gateway: Gateway, upstreams: Upstreams, stage: str, stream: bool
) -> None:
    """Real timing: the request is parked at ``stage`` (a slow body, a slow first token, a long answer)
    when the policy file is replaced by one without its route and backend."""
    if stage == "waiting for the first token":
        set_faults(upstreams.vllm, added_ttft_ms=40_000)  # 0.8 s real
    elif stage in ("mid-stream", "waiting for the whole answer"):
        set_faults(upstreams.vllm, reasoning_tokens=0, content_tokens=4_000)  # ~0.9 s real at 92 tok/s
    payload = orjson.dumps({"model": "vllm-only", "messages": HELLO, "stream": stream})
    result: dict[str, Any] = {}

    def trickled_body() -> Iterator[bytes]:
        yield payload[:10]
        time.sleep(0.5)  # the reload lands while the rest is still on its way
        yield payload[10:]

    def send() -> None:
        content = trickled_body() if stage == "sending its body" else payload
        with httpx.stream(
            "POST",
            gateway.base_url + "/chat/completions",
            content=content,
            headers={"content-type": "application/json"},
            timeout=30,
        ) as response:
            result["status"] = response.status_code
            result["backend"] = response.headers.get("x-gateway-backend")
            result["text"] = response.read().decode()

    before = len(gateway.runtime.recent)
    sender = threading.Thread(target=send)
    sender.start()
    if stage == "mid-stream":
        eventually(lambda: gateway.runtime.stats.local_inflight("b300-vllm") == 1, 10, "the stream is on")
        time.sleep(0.3)
    else:
        time.sleep(0.25)
    _reload(gateway, renamed_policy(upstreams))
    sender.join(timeout=30)
    assert result["status"] == 200, result
    assert result["backend"] == "b300-vllm"
    if stream:
        assert result["text"].rstrip().endswith("data: [DONE]") and "error" not in result["text"]
    eventually(lambda: len(gateway.runtime.recent) > before, 5, "the request is settled")
    observation = gateway.runtime.recent[-1]
    assert observation.status == "ok" and observation.backend == "b300-vllm"
    # After the reload, the route is gone: the next request gets a clear 404, not a 500.
    gone = httpx.post(gateway.base_url + "/chat/completions", content=payload, timeout=10)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"


# -- a client that leaves --------------------------------------------------------------------------


@pytest.fixture
def no_probes(gateway: Gateway) -> None:
    """Only users' requests reach the upstreams: a synthetic probe (issue 13) still in flight when the
    test slows an upstream down would hold a slot for as long as that upstream makes it wait. The
    start-up probes are let finish first, then probes are turned off."""
    eventually(lambda: gateway.runtime.probes.idle, 10, "the start-up probes are done")
    gateway.policy_path.write_text(gateway.policy_path.read_text() + "tuning:\n  probes: {enabled: false}\n")
    assert gateway.runtime.policy_source.reload_now()  # type: ignore[attr-defined]


class LeavingClient:
    """A raw HTTP/1.1 client that can hang up at any moment, as an impatient app does."""

    def __init__(self, gateway: Gateway, body: dict[str, Any]) -> None:
        payload = orjson.dumps(body)
        self.sock = socket.create_connection(("127.0.0.1", gateway.server.port), timeout=30)
        head = (
            "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n"
        )
        self.sock.sendall(head.encode() + payload)
        self.received = b""

    def read_until(self, marker: bytes) -> None:
        while marker not in self.received:
            data = self.sock.recv(65536)
            if not data:
                raise AssertionError(f"connection closed before {marker!r}: {self.received[-300:]!r}")
            self.received += data

    def leave(self) -> None:
        self.sock.close()


def llamacpp_busy_slots(upstreams: Upstreams) -> int:
    slots = httpx.get(upstreams.llamacpp.url + "/slots").json()
    return sum(bool(slot["is_processing"]) for slot in slots)


def vllm_running(upstreams: Upstreams) -> int:
    running: int = httpx.get(upstreams.vllm.url + "/emulator/state").json()["running"]
    return running


@pytest.mark.usefixtures("no_probes")
@pytest.mark.parametrize(
    ("route", "stage"),
    [
        ("llamacpp-only", "waiting for the first token"),
        ("llamacpp-only", "waiting for the whole answer"),
        ("llamacpp-only", "mid-stream"),
        ("vllm-only", "waiting for the first token"),
        ("vllm-only", "waiting for the whole answer"),
        ("vllm-only", "mid-stream"),
    ],
)
def test_a_client_that_leaves_frees_its_upstream_slot(
    gateway: Gateway, upstreams: Upstreams, route: str, stage: str
) -> None:
    llamacpp = route == "llamacpp-only"
    server = upstreams.llamacpp if llamacpp else upstreams.vllm
    busy = (lambda: llamacpp_busy_slots(upstreams)) if llamacpp else (lambda: vllm_running(upstreams))
    if stage == "waiting for the first token":
        set_faults(server, added_ttft_ms=600_000)  # 12 s real: the upstream would hold the slot that long
    else:
        set_faults(server, reasoning_tokens=0, content_tokens=100_000)  # far longer than the test
    stream = stage != "waiting for the whole answer"
    before = len(gateway.runtime.recent)
    client = LeavingClient(gateway, {"model": route, "messages": HELLO, "stream": stream})
    try:
        if stage == "mid-stream":
            client.read_until(b"data: ")  # tokens are flowing to the client
        eventually(lambda: busy() == 1, 10, "the upstream is working on the request")
        time.sleep(0.2)
        assert busy() == 1
    finally:
        client.leave()
    took = eventually(lambda: busy() == 0, 5, "the upstream slot is freed")
    assert took < 1.0, f"the slot stayed busy {took:.2f}s after the client left"
    eventually(lambda: len(gateway.runtime.recent) > before, 5, "the request is settled")
    observation = gateway.runtime.recent[-1]
    assert (observation.status, observation.error_type) == ("cancelled", "client_disconnected")
    assert observation.final is not None and observation.final.status == "cancelled"
    assert gateway.runtime.stats.local_inflight(observation.final.backend) == 0
    if stage == "mid-stream":
        usage = observation.final.usage
        assert usage is not None and usage.completion_tokens > 0, "tokens generated so far are counted"
    # The ledger row says so too (rows are written off the request path, about once a second).
    ledger = gateway.policy_path.parent / "ledger.sqlite3"
    where = ("request_id = ?", (observation.request_id,))
    eventually(lambda: ledger.exists() and len(ledger_rows(ledger, *where)) == 1, 10, "the ledger row")
    (row,) = ledger_rows(ledger, *where)
    assert (row["status"], row["error_type"]) == ("cancelled", "client_disconnected")


@pytest.mark.usefixtures("no_probes")
def test_the_gateway_still_serves_after_clients_left(gateway: Gateway, upstreams: Upstreams) -> None:
    set_faults(upstreams.llamacpp, added_ttft_ms=600_000)
    clients = [LeavingClient(gateway, {"model": "llamacpp-only", "messages": HELLO}) for _ in range(4)]
    eventually(lambda: llamacpp_busy_slots(upstreams) == 4, 10, "all four slots busy")
    for client in clients:
        client.leave()
    eventually(lambda: llamacpp_busy_slots(upstreams) == 0, 5, "every slot freed")
    set_faults(upstreams.llamacpp, added_ttft_ms=0)
    response = httpx.post(
        gateway.base_url + "/chat/completions", json={"model": "llamacpp-only", "messages": HELLO}, timeout=30
    )
    assert response.status_code == 200
