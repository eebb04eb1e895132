"""Starts benchmarked servers pinned to CPUs (taskset), stops them by pid, and reads their CPU time and
resident memory from /proc, summed over the process and its descendants."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    started: float  # perf_counter just before the process was spawned

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def pids(self) -> list[int]:
        return [self.pid, *descendants(self.pid)]

    def cpu_s(self) -> float:
        """User + system CPU seconds of the process tree so far."""
        return self._summed(11, 12) / CLK_TCK

    def minor_faults(self) -> int:
        """Page faults the process tree took without reading the disk (each a trip into the kernel;
        on a VM, often into the hypervisor too)."""
        return self._summed(7)

    def rss_bytes(self) -> int:
        return self._summed(21) * PAGE_SIZE

    def _summed(self, *indices: int) -> int:
        """The sum of these ``_stat_fields`` over the process tree (a process gone meanwhile adds 0)."""
        total = 0
        for pid in self.pids():
            fields = _stat_fields(pid)
            if fields is not None:
                total += sum(int(fields[i]) for i in indices)
        return total

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 5.0) -> None:
        """SIGTERM the process group this harness created for it (by its id), then SIGKILL if needed."""
        if not self.alive():
            return
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 2.0)):
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.popen.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def start(
    name: str, argv: list[str], *, cpus: str, log_dir: Path, env: Mapping[str, str] | None = None
) -> Proc:
    """Spawn ``argv`` under ``taskset -c cpus`` in its own session, output to ``log_dir/name.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    full_env = {**os.environ, **(env or {})}
    command = ["taskset", "-c", cpus, *argv] if shutil.which("taskset") else argv
    with log_path.open("wb") as log:
        started = time.perf_counter()
        popen = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    return Proc(name, popen, log_path, started)


def start_redis(name: str, port: int, *, cpus: str, log_dir: Path, timeout_s: float = 20.0) -> Proc:
    """A redis-server of the run's own on a loopback port, without persistence, once it answers PING;
    stopped by its pid."""
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    argv += ["--dir", str(log_dir), "--protected-mode", "yes"]
    proc = start(name, argv, cpus=cpus, log_dir=log_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.alive():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                if sock.recv(64).startswith(b"+PONG"):
                    return proc
        except OSError:
            time.sleep(0.05)
    proc.stop()
    raise RuntimeError(f"redis-server did not answer on port {port}:\n{proc.log_tail()}")


def pin_self(cpus: set[int]) -> None:
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setaffinity(0, cpus)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat_fields(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(children.get(child, []))
    return found


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [0] state, [1] ppid, [7] minflt, [11] utime,
    [12] stime, [21] rss pages."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def core_busy_s(core: int) -> float:
    """Non-idle CPU seconds of one core since boot (from /proc/stat), whoever used them."""
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith(f"cpu{core} "):
                ticks = [int(x) for x in line.split()[1:]]
                idle = ticks[3] + ticks[4]  # idle + iowait
                return (sum(ticks[:8]) - idle) / CLK_TCK
    return 0.0


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


@dataclass
class RssSampler:
    """Samples a process tree's RSS every ``interval_s`` while running; keeps the peak."""

    proc: Proc
    interval_s: float = 0.25
    peak_bytes: int = 0
    samples: list[int] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def __enter__(self) -> RssSampler:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        self._sample()

    def _sample(self) -> None:
        rss = self.proc.rss_bytes()
        self.samples.append(rss)
        self.peak_bytes = max(self.peak_bytes, rss)

    async def _run(self) -> None:
        while True:
            self._sample()
            await asyncio.sleep(self.interval_s)


@dataclass
class CpuWindow:
    """CPU seconds a process tree spent between the load generator's window marks, and how busy the two
    cores were with anything else meanwhile (other people's work on a shared machine skews results).

    ``core``: the measured process's core; ``load_core``: where this process and ``upstream`` run.
    """

    proc: Proc
    core: int = 0
    upstream: Proc | None = None
    load_core: int = 1
    marks: dict[str, tuple[float, ...]] = field(default_factory=dict)

    def __call__(self, mark: str) -> None:
        harness = time.process_time() + (self.upstream.cpu_s() if self.upstream is not None else 0.0)
        now = time.perf_counter()
        self.marks[mark] = (
            now,
            self.proc.cpu_s(),
            core_busy_s(self.core),
            core_busy_s(self.load_core),
            harness,
        )

    def _delta(self, i: int) -> float:
        if "start" not in self.marks or "end" not in self.marks:
            return 0.0
        return self.marks["end"][i] - self.marks["start"][i]

    @property
    def cpu_s(self) -> float:
        return self._delta(1)

    @property
    def foreign_share(self) -> float:
        """Share of the window the measured process's core spent on other processes."""
        wall = self._delta(0)
        return max(0.0, self._delta(2) - self._delta(1)) / wall if wall > 0 else 0.0

    @property
    def load_core_foreign_share(self) -> float | None:
        """Share of the window the load generator's core spent on anything but it and the upstream."""
        wall = self._delta(0)
        if self.upstream is None or wall <= 0:
            return None
        return max(0.0, self._delta(3) - self._delta(4)) / wall
