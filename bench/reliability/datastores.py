"""A PostgreSQL server of the run's own (``initdb`` and ``pg_ctl`` as the ``postgres`` user, its data
under a temporary directory, a free loopback port), restarted and stopped by its postmaster's pid:
the shared server on 5432 is never touched."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

PG_BIN = Path(os.environ.get("GATEWAY_PG_BIN", "/usr/lib/postgresql/15/bin"))


class PrivatePostgres:
    def __init__(self, port: int) -> None:
        self.port = port
        self.root = Path(tempfile.mkdtemp(prefix="chaos-pg-"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.log = self.root / "postgres.log"
        self._as_postgres = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as_postgres:
            owner = pwd.getpwnam("postgres")
            os.chown(self.root, owner.pw_uid, owner.pw_gid)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> PrivatePostgres:
        initdb = [str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync"]
        subprocess.run([*self._as_postgres, *initdb], check=True, capture_output=True, timeout=120)
        return self

    def start(self, timeout_s: float = 60.0) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        pg_ctl = [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w"]
        subprocess.run([*self._as_postgres, *pg_ctl, "start"], check=True, capture_output=True, timeout=120)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self, timeout_s: float = 60.0) -> None:
        """Fast shutdown (SIGINT to the postmaster, by pid): sessions are cut, as a restart does."""
        pid = self.pid()
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
        os.kill(pid, signal.SIGKILL)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
