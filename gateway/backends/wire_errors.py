"""What the wire client refuses and how it says so: ``WireError`` and the limits an upstream's answer
must stay within (head, headers, a whole body, a decompressed body)."""

from __future__ import annotations

from dataclasses import dataclass

PAUSE_AT_BYTES = 1 << 20  # unread body beyond this pauses the socket until the reader catches up
BODY_LIMIT = 32 * 1024 * 1024  # a whole body read at once (a JSON answer, a metrics page)


class WireError(Exception):
    """A call that failed on the wire. ``kind``: connect (no connection: refused, DNS, TLS, proxy),
    disconnected (before the head), broken (in the body), silent (no byte for the read clock),
    malformed (not HTTP the parser can read, or past a limit), decoding (a body that does not
    decompress). ``detail`` names what failed, for the attempt's record."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(detail or kind)
        self.kind = kind
        self.detail = detail or kind

    def copy(self) -> WireError:
        """The same failure as a new exception, for what keeps a failure and raises it later: raised,
        an exception takes the traceback of the frames it leaves, and those hold whatever kept it (a
        reference cycle for the collector, holding a request's objects, per failed response)."""
        return WireError(self.kind, self.detail)


@dataclass(frozen=True, slots=True)
class WireLimits:
    """Bounds on what one answer may cost us. aiohttp allows 8 KiB a header line and 32 KiB of head;
    h11 16 KiB: 64 KiB leaves room for the cookie-heavy heads some API fronts send."""

    head_bytes: int = 64 * 1024  # status line and headers, 1xx heads each counted alone
    headers: int = 256
    body_bytes: int = BODY_LIMIT
    # A compressed body, decompressed, over its whole length: a stream's gzip too. A zip bomb inflates
    # ~1000:1, so this (and not the network's pace) is what bounds its cost.
    inflated_bytes: int = 64 * 1024 * 1024
