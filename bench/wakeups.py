"""What it costs this machine to hand a message to a process on another core: ``python -m bench.wakeups
[--gap-ms 200] [--count 2000] [--gaps 60]``.

A proxy's light-load latency is not only its CPU. In ``bench.run``'s layout the gateway has core 0 and
the client and upstream share core 1: going direct, a request and its answer pass between two processes
on one core; through the gateway, the request crosses to core 0 and back twice (client -> gateway ->
upstream -> gateway -> client), and at 5 streams/s the gateway's core has been idle for ~200 ms before
each one. This measures one such hand-off: a one-byte TCP echo on loopback, the echo process pinned to
the client's core or to the other one, round trips back to back (the core never idles) and after a gap
(it does: on a VM the idle vCPU halts, and waking it is the hypervisor's work). Prints the p50 and p90
of each case and the machine's cpuidle driver and guest halt-polling setting, which decide the gap case.

Sends only to 127.0.0.1, a bounded number of bytes in a bounded time.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from pathlib import Path

from bench.loadgen import percentile
from bench.procs import pin_self

CLIENT_CORE = 1
HALT_POLL = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns")
CPUIDLE_DRIVER = Path("/sys/devices/system/cpu/cpuidle/current_driver")


def echo(port_file: Path, core: int) -> None:
    """The echo process: one connection, each byte sent back at once, until the client closes."""
    pin_self({core})
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port_file.write_text(str(listener.getsockname()[1]))
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(64):
                conn.sendall(data)


def round_trips(port: int, count: int, gap_s: float) -> list[float]:
    """``count`` one-byte round trips, ``gap_s`` of sleep before each; microseconds."""
    out = []
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(count):
            if gap_s:
                time.sleep(gap_s)
            began = time.perf_counter()
            conn.sendall(b"x")
            if not conn.recv(64):
                raise SystemExit("the echo process closed the connection")
            out.append((time.perf_counter() - began) * 1e6)
    return out


def measure(core: int, count: int, gap_s: float) -> list[float]:
    """Round trips to a fresh echo process on ``core``."""
    port_file = Path(f"/tmp/bench-wakeups-{os.getpid()}-{core}")
    port_file.unlink(missing_ok=True)
    pid = os.fork()
    if pid == 0:  # the echo process
        try:
            echo(port_file, core)
        finally:
            os._exit(0)
    try:
        deadline = time.monotonic() + 10.0
        while not port_file.exists() or not port_file.read_text():
            if time.monotonic() > deadline:
                raise SystemExit("the echo process did not start")
            time.sleep(0.01)
        return round_trips(int(port_file.read_text()), count, gap_s)
    finally:
        os.waitpid(pid, 0)
        port_file.unlink(missing_ok=True)


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return "(not present)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.wakeups", description=__doc__)
    parser.add_argument("--gap-ms", type=float, default=200.0, help="idle time before each gapped round trip")
    parser.add_argument("--count", type=int, default=2000, help="back-to-back round trips per case")
    parser.add_argument("--gaps", type=int, default=60, help="gapped round trips per case")
    args = parser.parse_args(argv)
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("needs two cores")
    pin_self({CLIENT_CORE})
    other = 0
    print(f"cpuidle driver: {read(CPUIDLE_DRIVER)}; guest halt polling (ns): {read(HALT_POLL)}")
    idle = f"after {args.gap_ms:g} ms idle"
    print(f"{'echo process on':<20} {'back to back, p50 / p90 (us)':>30} {idle + ', p50 / p90':>30}")
    medians = {}
    for label, core in (("the client's core", CLIENT_CORE), ("the other core", other)):
        hot = measure(core, args.count, 0.0)
        cold = measure(core, args.gaps, args.gap_ms / 1000)
        medians[core] = (statistics.median(hot), statistics.median(cold))
        print(
            f"{label:<20} {statistics.median(hot):>22.0f} / {percentile(hot, 0.9) or 0.0:<5.0f}"
            f" {statistics.median(cold):>22.0f} / {percentile(cold, 0.9) or 0.0:<5.0f}"
        )
    same, cross = medians[CLIENT_CORE], medians[other]
    print(
        f"a hand-off to the other core costs {cross[0] - same[0]:.0f} us more back to back and "
        f"{cross[1] - same[1]:.0f} us more after {args.gap_ms:g} ms idle (p50s); a proxy on the other core "
        "makes a request cross twice each way"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
