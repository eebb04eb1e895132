"""PostgreSQL for the tests: a database of this run's own on the server at 127.0.0.1:5432 (created,
then dropped), and a TCP proxy on loopback that a test can cut and restore to take the database
away from a gateway without touching the server."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

SERVER_URL = os.environ.get("GATEWAY_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")


def server_port() -> int:
    return urlsplit(SERVER_URL).port or 5432


def url_of(database: str, port: int | None = None) -> str:
    """The URL of ``database`` on the test server, or through a proxy listening on ``port``."""
    parts = urlsplit(SERVER_URL)
    userinfo, _, _ = parts.netloc.rpartition("@")
    host = f"{parts.hostname}:{port or server_port()}"
    netloc = f"{userinfo}@{host}" if userinfo else host
    return urlunsplit(parts._replace(netloc=netloc, path=f"/{database}"))


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    """A fresh database on the server; skips when no server answers (tests/check.sh starts one)."""
    try:
        admin = psycopg.connect(SERVER_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {SERVER_URL} ({exc}); tests/check.sh installs and starts one")
    name = f"gateway_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"'.encode())
        try:
            yield name
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


class TcpProxy:
    """Forwards a loopback port to the PostgreSQL server. ``cut()`` closes every connection and stops
    listening (the database looks gone); ``restore()`` listens on the same port again."""

    def __init__(self, target_port: int | None = None) -> None:
        self.target_port = target_port or server_port()
        self._listener = self._listen(0)
        self.port: int = self._listener.getsockname()[1]
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._accepting = threading.Thread(target=self._accept, args=(self._listener,), daemon=True)
        self._accepting.start()

    @staticmethod
    def _listen(port: int) -> socket.socket:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(128)
        return listener

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # cut: the listener was closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(sink)

    def cut(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self._listener = self._listen(self.port)
        self._accepting = threading.Thread(target=self._accept, args=(self._listener,), daemon=True)
        self._accepting.start()

    def close(self) -> None:
        self.cut()
