"""``gateway demo``: the three emulated Kimi K3 backends and the gateway, with nothing configured.

Each backend of the policy that lives on a loopback address gets the emulator of its dialect on its
port, started as a child process and stopped by process id on exit.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from gateway.policy.load import PolicyError, load_policy
from gateway.server import serve

PROFILE_OF_DIALECT = {"vllm": "b300-vllm", "llamacpp": "a100-llamacpp", "openai": "paid-api"}
# In `--real` mode this backend of the policy is served by a real llama.cpp server, not an emulator.
REAL_BACKEND = "gemma-local"
REAL_MODEL_FILE = "models/gemma3-270m-q4_k_m.gguf"
REAL_SETUP = "bash tests/real/setup_llamacpp.sh"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DEMO_PAID_KEY = "demo-paid-api-key"


def run_demo(policy_path: str, *, port: int, time_scale: float, log_level: str, real: bool = False) -> int:
    model_file = real_model_file()
    if real and (not model_file.is_file() or importlib.util.find_spec("llama_cpp") is None):
        print(
            f"gateway demo --real needs llama-cpp-python and the Gemma GGUF: run `{REAL_SETUP}`",
            file=sys.stderr,
        )
        return 2
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        print(f"gateway demo: the policy does not load:\n{exc}", file=sys.stderr)
        return 2
    children: list[subprocess.Popen[bytes]] = []
    # The paid-API emulator checks a bearer key, and the gateway sends the one named in the policy:
    # the demo shows credentials flowing from the environment, never from the file or the client.
    paid_key = os.environ.setdefault("PAID_API_KEY", DEMO_PAID_KEY)
    try:
        for backend in policy.backends.values():
            parts = urlsplit(backend.base_url)
            if parts.hostname not in LOOPBACK or parts.port is None:
                continue
            if real and backend.name == REAL_BACKEND:
                print(f"  starting real llama.cpp (Gemma 3 270M) for backend {backend.name} on :{parts.port}")
                children.append(subprocess.Popen(real_server_command(model_file, backend.model, parts.port)))
                wait_until_up(f"http://127.0.0.1:{parts.port}/v1/models", timeout_s=180)
                continue
            profile = PROFILE_OF_DIALECT[backend.dialect]
            print(f"  starting emulator {profile:<14} for backend {backend.name:<14} on :{parts.port}")
            env = {**os.environ, "EMULATOR_API_KEY": paid_key} if backend.dialect == "openai" else None
            command = [sys.executable, "-m", "gateway", "--log-level", "warning", "emulate"]
            command += ["--profile", profile, "--port", str(parts.port), "--time-scale", str(time_scale)]
            children.append(subprocess.Popen(command, env=env))
            wait_until_up(f"http://127.0.0.1:{parts.port}/health")
        print_welcome(port, real)
        return serve(policy_path, host="127.0.0.1", port=port, log_level=log_level)
    finally:
        for child in children:
            stop(child)


def real_model_file() -> Path:
    cache = os.environ.get("GATEWAY_CACHE") or str(Path.home() / ".cache" / "gateway")
    return Path(cache) / REAL_MODEL_FILE


def real_server_command(model_file: Path, served_name: str, port: int) -> list[str]:
    return [
        *(sys.executable, "-m", "llama_cpp.server", "--model", str(model_file)),
        *("--model_alias", served_name, "--chat_format", "gemma", "--n_ctx", "2048"),
        *("--host", "127.0.0.1", "--port", str(port)),
    ]


def wait_until_up(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"emulator at {url} did not come up in {timeout_s:g}s")


def stop(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is not None:
        return
    child.send_signal(signal.SIGTERM)
    try:
        child.wait(timeout=5)
    except subprocess.TimeoutExpired:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()


def print_welcome(port: int, real: bool = False) -> None:
    base = f"http://127.0.0.1:{port}/v1"
    if real:
        print('\nA real model answers on the route `gemma`: put "model": "gemma" in the examples below.')
    print(
        f"""
Gateway demo: OpenAI-compatible API at {base}
Routes (the names to put in "model"): see {base}/models

  curl {base}/chat/completions -H 'content-type: application/json' \\
    -d '{{"model": "kimi-k3", "messages": [{{"role": "user", "content": "Hello"}}]}}' -i

  python - <<'EOF'
  from openai import OpenAI
  client = OpenAI(base_url="{base}", api_key="unused-in-the-demo")
  stream = client.chat.completions.create(model="kimi-k3", stream=True,
      messages=[{{"role": "user", "content": "Hello"}}], stream_options={{"include_usage": True}})
  for chunk in stream:
      print(chunk.choices[0].delta if chunk.choices else chunk.usage)
  EOF

Ctrl-C stops the gateway and the emulators.
""",
        flush=True,
    )
