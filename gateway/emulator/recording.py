"""The emulator's memory of what it received: the last requests, with every header and the parsed body."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from starlette.requests import Request

CAPACITY = 200


class RequestLog:
    def __init__(self, clock: Callable[[], float], capacity: int = CAPACITY) -> None:
        self._clock = clock
        self._started_at = clock()
        self._entries: deque[dict[str, Any]] = deque(maxlen=capacity)

    def record(self, request: Request, body: Any, raw: bytes = b"") -> None:
        headers: dict[str, str] = {}
        for name, value in request.headers.items():
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        entry: dict[str, Any] = {
            "received_at_s": round(self._clock() - self._started_at, 6),
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "headers": headers,
            "body": body,
        }
        if body is None and raw:
            entry["raw_body"] = raw.decode("utf-8", errors="replace")
        self._entries.append(entry)

    def entries(self, path: str | None = None) -> list[dict[str, Any]]:
        """Oldest first; only those for ``path`` when given."""
        return [e for e in self._entries if path is None or e["path"] == path]

    def clear(self) -> int:
        cleared = len(self._entries)
        self._entries.clear()
        return cleared
