"""`gateway demo` as a newcomer meets it: the commands it prints run as printed, taken ports are
moved (never served against whatever answers there), one line per request unless --quiet."""

from __future__ import annotations

import importlib.util
import re
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.demo import print_welcome, write_example
from tests.servers import ProcessServer, free_port, python_module, threaded_server, wait_http

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PORTS = (8101, 8102, 8103)
REQUEST_LINE = re.compile(
    r"^kimi-k3 -> (b300-vllm|a100-llamacpp|paid-api)  \S+  ok  ttft \S+  tokens \d+ in / "
)


def policy_on_ports(tmp_path: Path, ports: tuple[int, int, int]) -> Path:
    """The default policy with its emulator ports (8101-8103) replaced, so tests never collide."""
    text = (REPO / "policies" / "default.yaml").read_text()
    for default, port in zip(DEFAULT_PORTS, ports, strict=True):
        text = text.replace(f"127.0.0.1:{default}", f"127.0.0.1:{port}")
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    return path


def foreign_app(hits: list[str]) -> Starlette:
    """Something else on a port the policy names: it answers every path, as any web server might."""

    async def anything(request: Request) -> JSONResponse:
        hits.append(request.url.path)
        return JSONResponse({"not": "an emulator"})

    return Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])


def start_demo(tmp_path: Path, policy: Path, port: int, *extra: str) -> tuple[ProcessServer, Path]:
    log = tmp_path / f"demo-{port}.log"
    args = python_module(
        "gateway", "demo", "--policy", str(policy), "--port", str(port), "--time-scale", "0.02"
    )
    demo = ProcessServer([*args, *extra], log_path=str(log), cwd=str(tmp_path)).start()
    wait_http(f"http://127.0.0.1:{port}/ready", timeout=60)
    return demo, log


def printed_commands(printed: str) -> list[str]:
    """The lines the demo tells people to paste, exactly as printed (minus the indent)."""
    block = printed.split("each line pastes as it is:\n\n", 1)[1].split("\n\n", 1)[0]
    return [line.strip() for line in block.splitlines()]


def run_as_pasted(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=60, check=False, cwd="/"
    )


def readme_block(language: str, after: str) -> str:
    text = (REPO / "README.md").read_text()
    section = text.split(after, 1)[1]
    return section.split(f"```{language}\n", 1)[1].split("```", 1)[0]


@pytest.fixture
def taken_port() -> Iterator[tuple[int, list[str]]]:
    """A port with a foreign HTTP server on it, and the paths that server was asked for."""
    hits: list[str] = []
    with threaded_server(foreign_app(hits)) as server:
        yield server.port, hits


def test_printed_commands_run_as_printed_on_moved_ports_with_a_line_per_request(
    tmp_path: Path, taken_port: tuple[int, list[str]]
) -> None:
    foreign, hits = taken_port
    vllm, paid = free_port(), free_port()
    policy = policy_on_ports(tmp_path, (vllm, foreign, paid))
    port = free_port()
    demo, log = start_demo(tmp_path, policy, port)
    try:
        commands = printed_commands(log.read_text())
        assert len(commands) == 2 and commands[0].startswith("curl ")
        curl, script = (run_as_pasted(c) for c in commands)
        assert curl.returncode == 0 and "x-gateway-backend:" in curl.stdout.lower(), curl.stderr
        assert script.returncode == 0, script.stderr
        assert "usage: CompletionUsage(" in script.stdout and "word0" in script.stdout
        # The README's quickstart, pasted as is, on this demo's port.
        quickstart = readme_block("python", "## Quickstart").replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        pasted = subprocess.run(
            [sys.executable, "-c", quickstart], capture_output=True, text=True, timeout=60
        )
        assert pasted.returncode == 0 and "usage:" in pasted.stdout, pasted.stderr
        readme_curl = readme_block("sh", "## Quickstart").replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        assert "x-gateway-route: kimi-k3" in run_as_pasted(readme_curl).stdout.lower()
        # Refused requests print a line too: the reason, and the route when the body named one.
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        assert httpx.post(url, json={"model": "no-such-model", "messages": []}).status_code == 404
        assert httpx.post(url, json={"model": "kimi-k3", "messages": []}).status_code == 400
    finally:  # a graceful stop: every request has settled, and printed its line, before it exits
        assert demo.stop() == 0
    printed = log.read_text()
    assert f":{foreign} -> :" in printed, "the taken port was named and moved"
    assert not any(path.startswith("/v1") for path in hits), "nothing was served against the foreign server"
    assert "(no route) -> refused: model_not_found  (chat)" in printed.splitlines(), printed
    assert "kimi-k3 -> refused: invalid_request_error  (chat)" in printed.splitlines(), printed
    lines = [
        line for line in printed.splitlines() if line.startswith("kimi-k3 -> ") and "refused" not in line
    ]
    assert len(lines) == 4, printed  # the two printed commands and the README's two snippets
    assert all(REQUEST_LINE.match(line) and " cost $" in line for line in lines), lines
    moved_policy = re.search(r"running the policy copy (\S+)", printed)
    assert moved_policy is not None and not Path(moved_policy.group(1)).exists(), "its temp files went too"
    for emulator_port in (vllm, paid):  # the demo's children went with it
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{emulator_port}/health", timeout=1)


def test_quiet_prints_no_line_per_request(tmp_path: Path) -> None:
    port = free_port()
    policy = policy_on_ports(tmp_path, (free_port(), free_port(), free_port()))
    demo, log = start_demo(tmp_path, policy, port, "--quiet")
    try:
        body = {"model": "kimi-k3", "messages": [{"role": "user", "content": "Hi"}]}
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30)
        assert answer.status_code == 200
    finally:
        assert demo.stop() == 0
    printed = log.read_text()
    assert not any(line.startswith("kimi-k3 -> ") for line in printed.splitlines()), printed
    assert "Each request prints a line" not in printed
    with sqlite3.connect(tmp_path / "var" / "ledger.sqlite3") as ledger:  # it did finish, silently
        assert ledger.execute("SELECT count(*) FROM requests").fetchone() == (1,)


def test_a_taken_gateway_port_stops_the_demo_with_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            python_module("gateway", "demo", "--port", str(port)),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            cwd=tmp_path,
        )
    assert result.returncode == 2
    assert f"port {port} is taken" in result.stderr and "gateway demo --port " in result.stderr
    assert "starting emulator" not in result.stdout, "nothing was started"


def test_without_the_openai_sdk_the_demo_prints_how_to_install_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # `pip install -e .` (the README's run command) does not install the openai SDK the script uses.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openai" else real_find_spec(name, *a)
    )
    print_welcome(8080, write_example(tmp_path, 8080))
    commands = printed_commands(capsys.readouterr().out)
    assert commands[1].startswith(f"{sys.executable} -m pip install openai")
    assert commands[2] == f"{sys.executable} {tmp_path / 'stream_chat.py'}"
    assert 'base_url="http://127.0.0.1:8080/v1"' in (tmp_path / "stream_chat.py").read_text()
