"""``gateway demo``: the three emulated Kimi K3 backends and the gateway, with nothing configured.

Each backend of the policy that lives on a loopback address gets the emulator of its dialect on its
port, started as a child process and stopped by process id on exit.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

import httpx

from gateway.policy.load import PolicyError, load_policy
from gateway.server import serve

PROFILE_OF_DIALECT = {"vllm": "b300-vllm", "llamacpp": "a100-llamacpp", "openai": "paid-api"}
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
DEMO_PAID_KEY = "demo-paid-api-key"


def run_demo(policy_path: str, *, port: int, time_scale: float, log_level: str) -> int:
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
            profile = PROFILE_OF_DIALECT[backend.dialect]
            print(f"  starting emulator {profile:<14} for backend {backend.name:<14} on :{parts.port}")
            env = {**os.environ, "EMULATOR_API_KEY": paid_key} if backend.dialect == "openai" else None
            command = [sys.executable, "-m", "gateway", "--log-level", "warning", "emulate"]
            command += ["--profile", profile, "--port", str(parts.port), "--time-scale", str(time_scale)]
            children.append(subprocess.Popen(command, env=env))
            wait_until_up(f"http://127.0.0.1:{parts.port}/health")
        print_welcome(port)
        return serve(policy_path, host="127.0.0.1", port=port, log_level=log_level)
    finally:
        for child in children:
            stop(child)


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


def print_welcome(port: int) -> None:
    base = f"http://127.0.0.1:{port}/v1"
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
