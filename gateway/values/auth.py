"""Who may call what: API keys checked by their SHA-256 digest, route permissions, admin access.

The policy stores only digests (``gateway keys create`` prints a key once with its ``auth:`` block), so
neither the file nor memory holds a client key. Keys are 256-bit random strings, which is why a fast
hash is enough. The digest is compared in constant time; errors never echo the key presented.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.datastructures import Headers

from gateway.errors import GatewayError

KEY_PREFIX = "gwk-"
ALL_ROUTES = "*"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"
    refusal = True

    def headers(self) -> dict[str, str]:
        return {"www-authenticate": 'Bearer realm="gateway"'}


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "route_not_allowed"
    refusal = True


@dataclass(frozen=True, slots=True)
class ApiKey:
    name: str
    digest: str  # hex SHA-256 of the key
    routes: frozenset[str]  # route names, or {"*"} for all
    admin: bool = False

    def may_use(self, route: str) -> bool:
        return ALL_ROUTES in self.routes or route in self.routes


def digest_of(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def presented_key(headers: Headers) -> str | None:
    """The client's key from ``Authorization: Bearer`` or ``x-api-key``; None when absent."""
    # One pass over the raw headers (lower-case names; the first of each counts, as Headers.get reads):
    # Headers.get raised and caught a KeyError for each header a request did not send.
    authorization = api_key = None
    for name, raw in headers.raw:
        if name == b"authorization" and authorization is None:
            authorization = raw.decode("latin-1")
        elif name == b"x-api-key" and api_key is None:
            api_key = raw.decode("latin-1")
    if authorization:
        scheme, _, value = authorization.partition(" ")
        return value.strip() if scheme.lower() == "bearer" and value.strip() else None
    return api_key or None


def authenticate(keys: Mapping[str, ApiKey], headers: Headers) -> ApiKey | None:
    """The key the request carries, or None when the policy configures no keys (an open gateway)."""
    if not keys:
        return None
    presented = presented_key(headers)
    if presented is None:
        raise AuthenticationFailed("no API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'")
    digest = digest_of(presented)
    found = keys.get(digest)
    # The lookup is by digest, which says nothing about the key; the comparison is constant-time anyway.
    if found is None or not hmac.compare_digest(found.digest, digest):
        raise AuthenticationFailed("the API key is not valid")
    return found


def authorize_route(key: ApiKey | None, route: str) -> None:
    if key is not None and not key.may_use(route):
        raise PermissionDenied(f"the API key '{key.name}' may not use the model '{route}'")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def policy_line(name: str, key: str, *, routes: list[str], admin: bool) -> str:
    """The YAML entry to paste under ``auth.keys`` in the policy (no routes given: all of them)."""
    routes_yaml = f"[{', '.join(routes)}]" if routes else f'["{ALL_ROUTES}"]'
    extra = ", admin: true" if admin else ""
    return f"- {{name: {name}, sha256: {digest_of(key)}, routes: {routes_yaml}{extra}}}"
