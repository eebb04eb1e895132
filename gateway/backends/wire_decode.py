"""Content-Encoding: gzip (every member of it) and deflate (zlib-wrapped, or raw as some servers send
it), inflated a bounded step at a time so that one small compressed read cannot become one huge
piece of memory, and decode errors that are errors, never an empty body."""

from __future__ import annotations

import zlib

from gateway.backends.wire_errors import WireError

INFLATE_STEP = 256 * 1024  # most bytes one step of inflation hands on


class Inflater:
    """Compressed bytes in (``feed``), decompressed pieces out (``step``) until ``pending`` is False;
    ``finish`` at the body's end says whether the stream was whole."""

    __slots__ = ("_cap", "_deflate", "_input", "_out", "_started", "_z")

    def __init__(self, encoding: bytes, cap: int) -> None:
        self._deflate = encoding == b"deflate"
        # gzip by its header; "deflate" is zlib-wrapped by the RFC, raw in some servers: tried second.
        self._z = zlib.decompressobj(zlib.MAX_WBITS if self._deflate else zlib.MAX_WBITS | 16)
        self._started = False  # some input inflated: too late to take "deflate" for raw deflate
        self._input = b""
        self._out = 0
        self._cap = cap

    @property
    def pending(self) -> bool:
        return bool(self._input)

    def feed(self, data: bytes) -> None:
        self._input = self._input + data if self._input else data

    def step(self) -> bytes:
        """The next decompressed piece (at most INFLATE_STEP bytes; may be b""). Raises ``WireError``."""
        data, self._input = self._input, b""
        z = self._z
        if z.eof:  # another gzip member follows the last (RFC 1952 allows several)
            if self._deflate:
                raise WireError("decoding", "data after the end of a deflate body")
            z = self._z = zlib.decompressobj(zlib.MAX_WBITS | 16)
        try:
            out = z.decompress(data, INFLATE_STEP)
        except zlib.error as exc:
            if not self._deflate or self._started:
                raise WireError("decoding", f"the body does not decompress ({exc})") from None
            self._started = True  # no zlib header: raw deflate, as IIS and others send it
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)
            self._input = data
            return self.step()
        self._started = True
        self._input = z.unconsumed_tail or z.unused_data
        self._out += len(out)
        if self._out > self._cap:
            raise WireError("malformed", f"the body decompresses past {self._cap} bytes")
        return out

    def finish(self) -> None:
        """The body ended: a compressed stream cut short is an error, not a shorter answer."""
        if self._started and not self._z.eof:
            raise WireError("decoding", "the compressed body ends before its end")
