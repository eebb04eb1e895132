"""Where a request goes: an ``Origin`` (scheme, host, port, the base path and query, the TLS context
and proxy its connections use) and the request heads it sends, built once per backend."""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit

from gateway.policy.urls import clean_url


@dataclass(frozen=True, slots=True)
class Proxy:
    """An HTTP proxy: https origins are tunnelled through it (CONNECT), http ones sent to it whole."""

    host: str
    port: int
    authorization: str | None = None  # "Basic ..." from the proxy URL's user:password

    @property
    def name(self) -> str:
        return f"proxy {self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Origin:
    """Where one base URL's requests go, and the head they share up to the path. Connections are pooled
    per Origin, so two backends on one host with different TLS settings or proxies never share one."""

    scheme: str
    host: str
    port: int
    base_path: str  # the URL's path without its trailing slash, e.g. "/v1", percent-encoded
    host_header: str
    query: str = ""  # the base URL's query ("api-version=..."), kept on every request
    tls: ssl.SSLContext | None = None  # None for https: the process's default context
    proxy: Proxy | None = None
    _hash: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # The pool looks an origin up a few times per request: its hash is computed once.
        key = (self.scheme, self.host, self.port, self.base_path, self.query, self.tls, self.proxy)
        object.__setattr__(self, "_hash", hash(key))

    def __hash__(self) -> int:
        return self._hash

    @classmethod
    def of(cls, base_url: str) -> Origin:
        url = clean_url(base_url)
        return cls._of(urlsplit(url), url)

    @classmethod
    def _of(cls, parts: SplitResult, url: str) -> Origin:
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        default = 443 if scheme == "https" else 80
        port = parts.port or default
        host = parts.hostname
        shown = f"[{host}]" if ":" in host else host
        host_header = shown if port == default else f"{shown}:{port}"
        return cls(scheme, host, port, parts.path.rstrip("/"), host_header, parts.query)

    @property
    def name(self) -> str:
        return f"{self.scheme}://{self.host_header}"

    def head(self, path: str, headers: dict[str, str]) -> bytes:
        """A POST's request line and headers up to (and without) the content-length value."""
        target = f"{self.base_path}{path}" + (f"?{self.query}" if self.query else "")
        lines = self._lines("POST", target, headers)
        lines.append("content-length: ")
        return "\r\n".join(lines).encode("latin-1")

    def get_head(self, target: str, headers: dict[str, str]) -> bytes:
        """A whole GET request for ``target`` (path and query, as sent), which has no body."""
        return ("\r\n".join(self._lines("GET", target, headers)) + "\r\n\r\n").encode("latin-1")

    def _lines(self, method: str, target: str, headers: dict[str, str]) -> list[str]:
        proxy = self.proxy
        if proxy is not None and self.scheme == "http":  # absolute-form: the proxy forwards it
            target = f"http://{self.host_header}{target}"
        lines = [f"{method} {target} HTTP/1.1", f"host: {self.host_header}"]
        if proxy is not None and proxy.authorization and self.scheme == "http":
            lines.append(f"proxy-authorization: {proxy.authorization}")
        lines += [f"{name}: {value}" for name, value in headers.items()]
        return lines


def split_url(url: str) -> tuple[Origin, str]:
    """An absolute http(s) URL as its origin and its request target ("/metrics?x=1"), made ASCII
    (``clean_url``); ValueError when it is not one."""
    parts = urlsplit(clean_url(url))
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin._of(parts._replace(path="", query=""), url), target
