"""Arize Phoenix as the tests and the docs' screenshot run it: `phoenix serve` from the virtual environment
tests/telemetry/setup_phoenix.sh installs, on free loopback ports, in a working directory of its own,
stopped by its process id."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from tests.servers import ProcessServer, free_port

SETUP = Path(__file__).parent / "setup_phoenix.sh"


def phoenix_python() -> Path | None:
    """The python of Phoenix's virtual environment, once setup_phoenix.sh has installed it."""
    cache = Path(os.environ.get("GATEWAY_CACHE", Path.home() / ".cache" / "gateway"))
    version = next(
        line.split("=", 1)[1]
        for line in SETUP.read_text().splitlines()
        if line.startswith("PHOENIX_VERSION=")
    )
    venv = cache / f"phoenix-{version}"
    return venv / "bin" / "python" if (venv / ".installed").is_file() else None


@contextlib.contextmanager
def running_phoenix(python: Path, workdir: Path) -> Iterator[str]:
    """Phoenix's URL (its UI, REST API and OTLP/HTTP receiver at /v1/traces) while it runs."""
    env = {
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port := free_port()),
        "PHOENIX_GRPC_PORT": str(free_port()),
        "PHOENIX_TELEMETRY_ENABLED": "false",  # its own usage telemetry: nothing leaves the machine
    }
    log = workdir / "phoenix.log"
    args = [str(python), "-m", "phoenix.server.main", "serve"]
    server = ProcessServer(args, env=env, log_path=str(log), cwd=str(workdir)).start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180  # its first start migrates a fresh database
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            assert server.proc is not None and server.proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "Phoenix did not start: " + log.read_text()
            time.sleep(0.25)
        yield url
    finally:
        server.stop()
