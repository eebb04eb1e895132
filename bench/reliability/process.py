"""A gateway (or emulator) as a real process on a loopback port, for the reliability scenarios: started
in its own session, stopped by its process id, and read from /proc (PSS, open file descriptors, TCP
sockets) to see whether it holds on to what it should have let go."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

import httpx

from bench.procs import Proc, start
from bench.servers import REPO


def pss_bytes(pid: int) -> int:
    """Proportional set size of one process (shared pages split among their users), from smaps_rollup."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024
    return 0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def open_sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            continue
    return count


def start_gateway(
    name: str, policy: Path, port: int, log_dir: Path, *extra: str, env: dict[str, str] | None = None
) -> Proc:
    """``gateway serve`` on 127.0.0.1:port, its ledger in ``log_dir``; returns once /health answers."""
    argv = [
        sys.executable, "-m", "gateway", "serve", "--policy", str(policy), "--port", str(port),
        "--ledger", str(log_dir / f"{name}-ledger.sqlite3"), *extra,
    ]  # fmt: skip
    proc = start(name, argv, cpus="0-1", log_dir=log_dir, env={"PYTHONPATH": str(REPO), **(env or {})})
    wait_until_up(proc, f"http://127.0.0.1:{port}/health")
    return proc


def start_emulator(name: str, profile: str, port: int, log_dir: Path, *extra: str) -> Proc:
    argv = [sys.executable, "-m", "gateway", "emulate", "--profile", profile, "--port", str(port), *extra]
    proc = start(name, argv, cpus="0-1", log_dir=log_dir, env={"PYTHONPATH": str(REPO)})
    wait_until_up(proc, f"http://127.0.0.1:{port}/health")
    return proc


def wait_until_up(proc: Proc, url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited at start:\n{proc.log_tail()}")
        try:
            if httpx.get(url, timeout=1.0).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.stop()
    raise RuntimeError(f"{proc.name} did not answer {url} within {timeout_s:.0f} s:\n{proc.log_tail()}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
