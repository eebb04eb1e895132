"""Upstream URLs made safe to put in a request head: IDN hosts punycoded, paths percent-encoded,
queries kept, anything that could break a head out of its line (CR, LF, other controls) refused.

The policy loader checks every backend URL with ``clean_url`` (a problem becomes a file:line error);
the wire client uses the same function on redirect targets, so a head is always ASCII it can write.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit, urlunsplit

# Characters a path or query may carry as they are (RFC 3986 pchar and '/', '?', plus '%' so an
# already-encoded URL stays as written).
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


def clean_url(url: str) -> str:
    """``url`` as an ASCII http(s) URL; ValueError saying why it cannot be one."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError("a URL must not contain control characters (CR, LF, tab, ...)")
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    host = ascii_host(parts.hostname)
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"bad port in {url!r}") from exc
    shown = f"[{host}]" if ":" in host else host
    netloc = shown if port is None else f"{shown}:{port}"
    if parts.username is not None:
        raise ValueError("put no credentials in a backend URL: use api_key_env")
    path = quote(parts.path, safe=_PATH_SAFE)
    query = quote(parts.query, safe=_QUERY_SAFE)
    return urlunsplit((scheme, netloc, path, query, ""))


def ascii_host(host: str) -> str:
    """A host name as DNS and a Host header take it: IDN labels in punycode, lowercase."""
    if host.isascii():
        return host.lower()
    try:
        return host.encode("idna").decode("ascii").lower()
    except UnicodeError as exc:
        raise ValueError(f"host {host!r} is not a valid international domain name") from exc


def header_value_problem(value: str) -> str | None:
    """Why ``value`` cannot go into a header as it is, or None: a CR or LF would end the header
    there (and let the rest inject another), other controls and non-latin-1 text cannot be sent."""
    if "\r" in value or "\n" in value:
        return "contains a line break (CR or LF), which would inject a header"
    if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in value):
        return "contains a control character"
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return "contains characters a header cannot carry (not latin-1)"
    return None
