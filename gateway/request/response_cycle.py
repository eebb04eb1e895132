"""One request's response on the client's connection: uvicorn's ``RequestResponseCycle`` with a cheaper
``send`` for the head, measured as the largest part of the server's own CPU per request (issue 39).

Two differences, nothing else: a response with a ``content-length`` (a whole answer, an error) goes out
in one ``write``, its head held until the first piece of its body (uvicorn writes the head at once: two
``send`` system calls and two packets for every whole answer); and the headers are checked for
forbidden bytes with one search over all names and one over all values, not two per header (the
patterns are single-character classes, so the joined bytes hold one exactly when a header does). A
chunked response (a stream) writes its head at once, as before (``DirectBody`` writes after it), unless
its start message asks with ``HOLD_HEAD``: the relay sends its first event right after its start, and
the two then leave in one write, one packet the client wakes for once (issue 39).
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

# A chunked response's start message with this key set: its head waits for the body's first piece (which
# must follow at once: ``DirectBody`` writes only after it), and leaves with it.
HOLD_HEAD = "gateway.hold_head"


class GatewayCycle(RequestResponseCycle):
    """A ``RequestResponseCycle`` whose whole answers leave in one write; see the module's docstring."""

    held_head: bytes | None = None  # a content-length response's head, until its body's first piece

    async def send(self, message: Any) -> None:
        if self.response_started:
            held = self.held_head
            if held is None or message["type"] != "http.response.body" or self.disconnected:
                await super().send(message)  # a chunked stream's pieces, or what uvicorn refuses
                return
            self.held_head = None
            await self._send_first_piece(held, message)
            return
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        if message["type"] != "http.response.start":
            raise RuntimeError(f"Expected ASGI message 'http.response.start', but got '{message['type']}'.")
        self.response_started = True
        self.waiting_for_100_continue = False
        head = self._head(message["status"], [*self.default_headers, *message.get("headers", ())])
        if self.scope["method"] != "HEAD" and (self.chunked_encoding is False or HOLD_HEAD in message):
            self.held_head = head
        else:
            self.transport.write(head)

    async def _send_first_piece(self, head: bytes, message: Any) -> None:
        """The held head and the body's first piece in one write, framed and checked as uvicorn does."""
        body = message.get("body", b"")
        more_body = message.get("more_body", False)
        if self.chunked_encoding:
            piece = b"%x\r\n%b\r\n" % (len(body), body) if body else b""
            self.transport.write(head + piece if more_body else head + piece + b"0\r\n\r\n")
        else:
            if len(body) > self.expected_content_length:
                raise RuntimeError("Response content longer than Content-Length")
            self.expected_content_length -= len(body)
            self.transport.write(head + body if body else head)
        if not more_body:
            if self.expected_content_length != 0:
                raise RuntimeError("Response content shorter than Content-Length")
            self.response_complete = True
            self.message_event.set()
            if not self.keep_alive:
                self.transport.close()
            self.on_response()

    def _head(self, status_code: int, headers: list[tuple[bytes, bytes]]) -> bytes:
        """The status line and headers, as uvicorn writes them; sets the framing (length or chunked)."""
        if HEADER_RE.search(b"".join([name for name, _ in headers])):
            raise RuntimeError("Invalid HTTP header name.")
        if HEADER_VALUE_RE.search(b"".join([value for _, value in headers])):
            raise RuntimeError("Invalid HTTP header value.")
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                status_code,
            )
        content = [STATUS_LINE[status_code]]
        has_connection_close = False
        for name, value in headers:
            name = name.lower()
            if name == b"content-length" and self.chunked_encoding is None:
                self.expected_content_length = int(value.decode())
                self.chunked_encoding = False
            elif name == b"transfer-encoding" and value.lower() == b"chunked":
                self.expected_content_length = 0
                self.chunked_encoding = True
            elif name == b"connection" and b"close" in [t.lower().strip() for t in value.split(b",")]:
                self.keep_alive = False
                has_connection_close = True
            content.extend((name, b": ", value, b"\r\n"))
        if not self.keep_alive and not has_connection_close:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status_code not in (204, 304):
            self.chunked_encoding = True  # neither content-length nor transfer-encoding given
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)
