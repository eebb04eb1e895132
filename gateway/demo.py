"""``gateway demo``: the three emulated Kimi K3 backends and the gateway, with nothing configured.

Each backend of the policy that lives on a loopback address gets the emulator of its dialect on its
port (a free one, in a copy of the policy, when that port is taken), started as a child process and
stopped by process id on exit. It prints ready commands, and one line per request unless ``--quiet``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import PolicyError, load_policy
from gateway.request_line import line_printer
from gateway.server import serve

PROFILE_OF_DIALECT = {"vllm": "b300-vllm", "llamacpp": "a100-llamacpp", "openai": "paid-api"}
# In `--real` mode this backend of the policy is served by a real llama.cpp server, not an emulator.
REAL_BACKEND = "gemma-local"
REAL_MODEL_FILE = "models/gemma3-270m-q4_k_m.gguf"
# llama.cpp's own C++ server, built by tests/real/build_llama_server.sh from the llama.cpp that this
# llama-cpp-python release vendors, and cached under this name.
LLAMA_SERVER_VERSION = "0.3.36"
REAL_SETUP = "bash tests/real/setup_llamacpp.sh"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DEMO_PAID_KEY = "demo-paid-api-key"
LOOPBACK_URL_PORT = re.compile(r"(https?://(?:127\.0\.0\.1|localhost|\[::1\]):)(\d+)")


def run_demo(
    policy_path: str, *, port: int, time_scale: float, log_level: str, real: bool = False, quiet: bool = False
) -> int:
    model_file = real_model_file()
    server_binary = real_server_binary()
    if real and (not model_file.is_file() or server_binary is None):
        print(
            f"gateway demo --real needs llama.cpp's llama-server and the Gemma GGUF: run `{REAL_SETUP}`",
            file=sys.stderr,
        )
        return 2
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        print(f"gateway demo: the policy does not load:\n{exc}", file=sys.stderr)
        return 2
    if not port_is_free(port):
        print(
            f"gateway demo: port {port} is taken (another demo or gateway?); "
            f"pick another: gateway demo --port {free_port()}",
            file=sys.stderr,
        )
        return 2
    children: list[subprocess.Popen[bytes]] = []
    workdir = Path(tempfile.mkdtemp(prefix="gateway-demo-"))
    # The paid-API emulator checks a bearer key, and the gateway sends the one named in the policy:
    # the demo shows credentials flowing from the environment, never from the file or the client.
    paid_key = os.environ.setdefault("PAID_API_KEY", DEMO_PAID_KEY)
    try:
        moved = moved_ports(policy)
        if moved:
            # Something else answers on the policy's ports: run a copy of the policy on free ones,
            # rather than serving against whatever listens there.
            policy_path = str(workdir / Path(policy_path).name)
            Path(policy_path).write_text(with_ports(Path(policy.source).read_text(), moved))
            policy = load_policy(policy_path)
            taken = ", ".join(f":{old} -> :{new}" for old, new in moved.items())
            print(f"  ports taken, emulators moved ({taken}); running the policy copy {policy_path}")
        for backend in policy.backends.values():
            parts = urlsplit(backend.base_url)
            if parts.hostname not in LOOPBACK or parts.port is None:
                continue
            if real and backend.name == REAL_BACKEND and server_binary is not None:
                print(f"  starting real llama.cpp (Gemma 3 270M) for backend {backend.name} on :{parts.port}")
                command = real_server_command(server_binary, model_file, backend.model, parts.port)
                # llama-server logs every request at length; the demo's own line per request says enough.
                child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                children.append(child)
                # /health answers 503 while the model loads, 200 once it serves.
                wait_until_up(child, f"http://127.0.0.1:{parts.port}/health", timeout_s=180)
                continue
            profile = PROFILE_OF_DIALECT[backend.dialect]
            print(f"  starting emulator {profile:<14} for backend {backend.name:<14} on :{parts.port}")
            env = {**os.environ, "EMULATOR_API_KEY": paid_key} if backend.dialect == "openai" else None
            command = [sys.executable, "-m", "gateway", "--log-level", "warning", "emulate"]
            command += ["--profile", profile, "--port", str(parts.port), "--time-scale", str(time_scale)]
            child = subprocess.Popen(command, env=env)
            children.append(child)
            wait_until_up(child, f"http://127.0.0.1:{parts.port}/health")
        print_welcome(port, write_example(workdir, port), real=real, quiet=quiet)
        listener = None if quiet else line_printer()
        return serve(policy_path, host="127.0.0.1", port=port, log_level=log_level, request_listener=listener)
    except DemoFailed as exc:
        print(f"gateway demo: {exc}", file=sys.stderr)
        return 2
    finally:
        for child in children:
            stop(child)
        shutil.rmtree(workdir, ignore_errors=True)


class DemoFailed(Exception):
    """A child would not start; the message says which and why."""


def port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is free
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def moved_ports(policy: CompiledPolicy) -> dict[int, int]:
    """Taken loopback ports of the policy's backends, each with a free port to use instead."""
    ports = {urlsplit(b.base_url).port for b in policy.backends.values() if _on_loopback(b.base_url)}
    return {port: free_port() for port in sorted(p for p in ports if p is not None) if not port_is_free(port)}


def with_ports(policy_text: str, moved: dict[int, int]) -> str:
    """The policy's text with every loopback URL on a moved port (API, metrics, slots, health) moved."""

    def move(match: re.Match[str]) -> str:
        port = int(match.group(2))
        return f"{match.group(1)}{moved.get(port, port)}"

    return LOOPBACK_URL_PORT.sub(move, policy_text)


def _on_loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.hostname in LOOPBACK and parts.port is not None


def real_model_file() -> Path:
    return gateway_cache() / REAL_MODEL_FILE


def gateway_cache() -> Path:
    return Path(os.environ.get("GATEWAY_CACHE") or Path.home() / ".cache" / "gateway")


def real_server_binary() -> Path | None:
    """The cached llama-server build, else one on PATH, else None."""
    cached = gateway_cache() / "bin" / f"llama-server-{LLAMA_SERVER_VERSION}"
    if os.access(cached, os.X_OK):
        return cached
    found = shutil.which("llama-server")
    return Path(found) if found else None


# The connections the gateway's signal scraper keeps to one llama-server: metrics, slots and health.
SCRAPER_CONNECTIONS = 3


def real_server_command(
    binary: Path,
    model_file: Path,
    served_name: str,
    port: int,
    *,
    slots: int = 1,
    context_tokens: int = 2048,
    threads: int | None = None,
    chat_template: str = "gemma",
) -> list[str]:
    """llama-server with what the gateway reads: ``--metrics`` (off by default) and ``--slots``.

    ``--ctx-size`` is shared by the slots, so it is ``context_tokens`` per slot times ``slots``.
    ``--threads-http``: llama-server serves each connection on a thread of a fixed pool, ``--parallel`` + 2
    by default, and a kept-alive connection holds its thread between requests. The gateway's scraper
    reads metrics, slots and health at once on kept-alive connections (three threads), so with one
    request queued beyond the slots the default pool left /metrics waiting for a thread (seen: a 10 s
    timeout in CI); three more threads than the default leave room for the scraper. This
    GGUF carries no chat template, and llama-server would fall back to ChatML without a word: the
    built-in ``gemma`` template is named instead, which needs ``--no-jinja`` (with Jinja on, the
    default, ``--chat-template`` is read as the template's source text).
    """
    command = [str(binary), "--model", str(model_file), "--alias", served_name]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    command += ["--parallel", str(slots), "--ctx-size", str(context_tokens * slots)]
    command += ["--threads-http", str(slots + 2 + SCRAPER_CONNECTIONS)]
    command += ["--no-jinja", "--chat-template", chat_template, "--metrics", "--slots"]
    if threads is not None:
        command += ["--threads", str(threads)]
    return command


def wait_until_up(child: subprocess.Popen[bytes], url: str, timeout_s: float = 30.0) -> None:
    """Until ``url`` answers, while ``child`` (the server meant to answer it) still runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            port = urlsplit(url).port
            raise DemoFailed(f"the server for :{port} exited (code {child.returncode}); is :{port} taken?")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise DemoFailed(f"{url} did not come up in {timeout_s:g}s")


def stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()


EXAMPLE_SCRIPT = """\
# Written by `gateway demo`: a streamed chat completion through the gateway, with the openai SDK.
from openai import OpenAI

client = OpenAI(base_url="{base}", api_key="unused-in-the-demo")
stream = client.chat.completions.create(
    model="kimi-k3",  # a route of the policy, not a backend
    messages=[{{"role": "user", "content": "Hello"}}],
    stream=True,
    stream_options={{"include_usage": True}},
)
for chunk in stream:
    if chunk.usage:
        print("\\nusage:", chunk.usage)  # completion_tokens include the reasoning tokens
    elif chunk.choices:
        delta = chunk.choices[0].delta.model_dump()
        print(delta.get("reasoning") or delta.get("reasoning_content") or delta.get("content") or "", end="")
"""


def write_example(folder: Path, port: int) -> Path:
    script = folder / "stream_chat.py"
    script.write_text(EXAMPLE_SCRIPT.format(base=f"http://127.0.0.1:{port}/v1"))
    return script


def print_welcome(port: int, script: Path, *, real: bool = False, quiet: bool = False) -> None:
    base = f"http://127.0.0.1:{port}/v1"
    body = '{"model": "kimi-k3", "messages": [{"role": "user", "content": "Hello"}]}'
    python = shlex.quote(sys.executable)
    install = ""
    if importlib.util.find_spec("openai") is None:
        install = f"  {python} -m pip install openai   # the script below needs the openai SDK\n"
    lines = (
        "" if quiet else "Each request prints a line here: route -> backend, decision, TTFT, tokens, cost.\n"
    )
    if real:
        print('\nA real model answers on the route `gemma`: put "model": "gemma" in the examples below.')
    print(
        f"""
Gateway demo: OpenAI-compatible API at {base}
Routes (the names to put in "model"): see {base}/models

Try it from another terminal; each line pastes as it is:

  curl -si {base}/chat/completions -H 'content-type: application/json' -d '{body}'
{install}  {python} {shlex.quote(str(script))}

{lines}Ctrl-C stops the gateway and the emulators.
""",
        flush=True,
    )
