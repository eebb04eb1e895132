"""A PostgreSQL server of a test's own, which the test may stop (fast or immediate) and start again:
a cluster made by ``initdb`` in a temporary folder, listening on a free loopback port, run as the
``postgres`` user (``runuser``) since the server refuses to run as root. The machine's shared server
(127.0.0.1:5432) is never touched; this one is stopped through its own data folder's pid file."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.servers import free_port

BIN = Path(os.environ.get("GATEWAY_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PrivatePostgres:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_postgres(self, *args: str, timeout: float = 120) -> None:
        command = ["runuser", "-u", "postgres", "--", *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)}: {result.stdout}{result.stderr}")

    def create(self) -> PrivatePostgres:
        shutil.chown(self.root, "postgres", "postgres")
        # trust on loopback: this server answers only this test; no fsync: the test stops the server,
        # never the machine, so what it wrote survives in the page cache either way.
        self._as_postgres(str(BIN / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-N")
        return self

    def start(self) -> None:
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        log = str(self.root / "server.log")
        self._as_postgres(str(BIN / "pg_ctl"), "start", "-D", str(self.data), "-o", options, "-l", log, "-w")

    def stop(self, mode: str = "fast") -> None:
        """``fast``: sessions are ended and the server shuts down cleanly; ``immediate``: it quits at
        once, as a crash would, and recovers from its WAL at the next start."""
        self._as_postgres(str(BIN / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w")

    def processes(self) -> list[int]:
        """The server's processes: the postmaster (its pid file's first line) and its children (the
        sessions and background workers), which is what a hung host would freeze."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
                if int(stat.read_text().rpartition(")")[2].split()[1]) == postmaster:
                    children.append(int(stat.parent.name))
        return [postmaster, *children]

    @property
    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def query(self, sql: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.url, connect_timeout=5) as conn:
            return list(conn.execute(sql.encode()).fetchall())


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started private server, stopped and deleted at the end; skips where it cannot be made."""
    if not (BIN / "initdb").exists() or shutil.which("runuser") is None or os.geteuid() != 0:
        pytest.skip(f"a private PostgreSQL needs {BIN}/initdb and root (to run it as postgres)")
    root = Path(tempfile.mkdtemp(prefix="gateway-pg-"))
    server = PrivatePostgres(root)
    try:
        server.create().start()
        yield server
    finally:
        if server.running:
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                server.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
