"""Opening a connection to an origin: DNS (cached for a while), happy eyeballs over its addresses,
TLS (the origin's own context or the process default), an HTTP proxy's CONNECT tunnel, and failures
that say what failed (refused, DNS, TLS verification and why, the proxy) rather than a class name.

Also the proxy an origin takes from the environment (``HTTP(S)_PROXY``, ``NO_PROXY``), as httpx's
``trust_env`` reads it.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any, cast
from urllib.parse import unquote, urlsplit

from gateway.backends.wire_errors import WireError
from gateway.backends.wire_origin import Origin, Proxy
from gateway.policy.urls import ascii_host

DNS_TTL_S = 30.0  # how long resolved addresses are reused (a pool's IPs change rarely; a failover does)
HAPPY_EYEBALLS_DELAY_S = 0.25  # RFC 8305's recommended wait before trying the next address
CONNECT_HEAD_LIMIT = 16 * 1024  # the proxy's answer to CONNECT


class Dialer:
    """Opens connections; holds the DNS cache and the default TLS context (built on first https use)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._dns: dict[tuple[str, int], tuple[float, list[tuple[Any, ...]]]] = {}
        self._default_tls: ssl.SSLContext | None = None

    async def dial(
        self, origin: Origin, connect_s: float | None, factory: Callable[[], asyncio.Protocol]
    ) -> Any:
        """A connected protocol from ``factory`` for ``origin``, within ``connect_s``; else WireError
        ("connect") naming what failed."""
        proxy = origin.proxy
        what = origin.name if proxy is None else proxy.name
        try:
            async with asyncio.timeout(connect_s):
                if proxy is None:
                    return await self._open(origin.host, origin.port, factory, self._tls(origin), origin.host)
                if origin.scheme == "http":  # absolute-form requests straight to the proxy
                    return await self._open(proxy.host, proxy.port, factory, None, None)
                return await self._tunnel(origin, proxy, factory)
        except TimeoutError:
            raise WireError("connect", f"{what}: no connection in {connect_s:g}s") from None
        except WireError:
            raise
        except OSError as exc:
            raise WireError("connect", f"{what}: {describe(exc)}") from exc

    def _tls(self, origin: Origin) -> ssl.SSLContext | None:
        if origin.scheme != "https":
            return None
        if origin.tls is not None:
            return origin.tls
        if self._default_tls is None:
            self._default_tls = ssl.create_default_context()  # reads SSL_CERT_FILE / SSL_CERT_DIR
        return self._default_tls

    async def _open(
        self,
        host: str,
        port: int,
        factory: Callable[[], asyncio.Protocol],
        tls: ssl.SSLContext | None,
        server_hostname: str | None,
    ) -> asyncio.Protocol:
        infos = await self._resolve(host, port)
        loop = asyncio.get_running_loop()

        async def attempt(info: tuple[Any, ...]) -> asyncio.Protocol:
            family, kind, proto, _, address = info
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                await loop.sock_connect(sock, address)
            except BaseException:
                sock.close()
                raise
            _, protocol = await loop.create_connection(
                factory, sock=sock, ssl=tls, server_hostname=server_hostname if tls is not None else None
            )
            return protocol

        protocol: asyncio.Protocol = await _first_of(infos, attempt)
        return protocol

    async def _resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        key = (host, port)
        cached = self._dns.get(key)
        now = self._clock()
        if cached is not None and cached[0] > now:
            return cached[1]
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            socket.inet_pton(family, host)
        except OSError:
            pass
        else:  # an IP literal: nothing to resolve
            address = (host, port, 0, 0) if family == socket.AF_INET6 else (host, port)
            return [(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", address)]
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise OSError(f"DNS lookup of {host} failed ({exc.strerror})") from exc
        infos = _interleaved(infos)
        self._dns[key] = (now + DNS_TTL_S, infos)
        return infos

    async def _tunnel(self, origin: Origin, proxy: Proxy, factory: Callable[[], asyncio.Protocol]) -> Any:
        """CONNECT through ``proxy``, then TLS to the origin inside the tunnel."""
        loop = asyncio.get_running_loop()
        tunnel = cast(
            _TunnelReply, await self._open(proxy.host, proxy.port, lambda: _TunnelReply(loop), None, None)
        )
        host = origin.host
        target = f"[{host}]:{origin.port}" if ":" in host else f"{host}:{origin.port}"
        lines = [f"CONNECT {target} HTTP/1.1", f"host: {target}"]
        if proxy.authorization:
            lines.append(f"proxy-authorization: {proxy.authorization}")
        transport = tunnel.transport
        assert transport is not None
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        try:
            status = await tunnel.status
        except BaseException:
            transport.close()
            raise
        if status != 200:
            transport.close()
            raise WireError("connect", f"{proxy.name}: CONNECT {target} answered HTTP {status}")
        protocol = factory()
        tls = self._tls(origin)
        assert tls is not None
        try:
            tls_transport = await loop.start_tls(transport, protocol, tls, server_hostname=origin.host)
        except BaseException:
            transport.close()
            raise
        if tls_transport is None:
            raise WireError("connect", f"{proxy.name}: the tunnel closed during the TLS handshake")
        protocol.connection_made(tls_transport)  # start_tls does not: the protocol was made here
        return protocol


class _TunnelReply(asyncio.Protocol):
    """Reads a proxy's answer to CONNECT: its status once the head is complete."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.transport: asyncio.Transport | None = None
        self.status: asyncio.Future[int] = loop.create_future()
        self._head = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.status.done():
            return
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0:
            if len(self._head) > CONNECT_HEAD_LIMIT:
                self.status.set_exception(WireError("connect", "the proxy's answer to CONNECT is too long"))
            return
        if end + 4 != len(self._head):  # a tunnel carries nothing before our TLS hello
            self.status.set_exception(WireError("connect", "the proxy said more than its answer to CONNECT"))
            return
        parts = self._head.split(b"\r\n", 1)[0].split(b" ", 2)
        try:
            self.status.set_result(int(parts[1]))
        except (IndexError, ValueError):
            self.status.set_exception(WireError("connect", "the proxy's answer to CONNECT is not HTTP"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.status.done():
            self.status.set_exception(WireError("connect", "the proxy closed the connection during CONNECT"))


async def _first_of(infos: list[tuple[Any, ...]], attempt: Callable[[tuple[Any, ...]], Any]) -> Any:
    """Happy eyeballs (RFC 8305): try each address in turn, starting the next one after
    HAPPY_EYEBALLS_DELAY_S or as soon as the last failed; the first to connect wins."""
    if len(infos) == 1:
        return await attempt(infos[0])
    errors: list[BaseException] = []
    running: set[asyncio.Task[Any]] = set()
    pending = list(infos)
    try:
        while pending or running:
            if pending:
                running.add(asyncio.ensure_future(attempt(pending.pop(0))))
            done, _ = await asyncio.wait(
                running,
                timeout=HAPPY_EYEBALLS_DELAY_S if pending else None,
                return_when=asyncio.FIRST_COMPLETED,
            )
            for task in done:
                running.discard(task)
                if task.exception() is None:
                    return task.result()
                errors.append(cast(BaseException, task.exception()))
        raise errors[0]
    finally:
        for task in running:
            task.cancel()
            task.add_done_callback(_close_winner)


def _close_winner(task: asyncio.Task[Any]) -> None:
    """A connection that won after another already had: not needed, closed."""
    if not task.cancelled() and task.exception() is None:
        transport = getattr(task.result(), "transport", None)
        if transport is not None:
            transport.close()


def _interleaved(infos: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Addresses alternating between families, the resolver's first family first (RFC 8305 4)."""
    if not infos:
        return infos
    first = [i for i in infos if i[0] == infos[0][0]]
    other = [i for i in infos if i[0] != infos[0][0]]
    out: list[tuple[Any, ...]] = []
    for n in range(max(len(first), len(other))):
        out += first[n : n + 1] + other[n : n + 1]
    return out


def describe(exc: BaseException) -> str:
    """A connect failure in words: refused, DNS, TLS verification with its reason, ..."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed ({exc.verify_message})"
    if isinstance(exc, ssl.SSLError):
        return f"TLS handshake failed ({exc.reason or exc})"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if exc.__cause__ is not None and isinstance(exc.__cause__, socket.gaierror):
        return str(exc.args[0]) if exc.args else "DNS lookup failed"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror.lower()}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def proxy_from_env(scheme: str, host: str, environ: Mapping[str, str]) -> Proxy | None:
    """The proxy ``HTTP_PROXY``/``HTTPS_PROXY`` (any case) name for this scheme, unless ``NO_PROXY``
    covers ``host``. Only http:// proxies are spoken to (CONNECT for https origins)."""
    proxies = {
        name[: -len("_proxy")].lower(): value
        for name, value in environ.items()
        if name.lower().endswith("_proxy") and value
    }
    url = proxies.get(scheme)
    if not url:
        return None
    no_proxy = proxies.get("no", "")
    if no_proxy and _bypassed(host, no_proxy):
        return None
    return parse_proxy(url)


def _bypassed(host: str, no_proxy: str) -> bool:
    if no_proxy.strip() == "*":
        return True
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if not entry:
            continue
        entry = entry.lstrip(".").split(":", 1)[0] if not entry.startswith("[") else entry.strip("[]")
        if host == entry or host.endswith("." + entry):
            return True
    return False


def parse_proxy(url: str) -> Proxy:
    """A proxy URL (``http://user:pass@host:3128``; no scheme means http); ValueError if unusable."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme.lower() != "http" or not parts.hostname:
        raise ValueError(f"only http:// proxies are supported, not {url!r}")
    authorization = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        authorization = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    return Proxy(ascii_host(parts.hostname), parts.port or 80, authorization)
