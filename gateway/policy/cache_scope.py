"""Who shares a prefix cache: each request's cache scope, from its route's and its API key's
``prefix_cache: {share: fleet | key | team}`` (schema.PrefixSharing).

A scope is what a prefix may be found again under. The fleet's scope is one for every request; a key's
(or a team's) has a seed for the gateway's prefix keys (``gateway.measure.prefix_keys``), so the index
never tells one scope of another's prompts, and a salt for the engines that take one (vLLM's and
SGLang's ``cache_salt``, docs/contracts/), so the engine never reuses one scope's blocks for another
and its TTFT tells nothing either. Both are derived here, at load, with HMAC-SHA256 from the SHA-256
digests of the scope's keys, which only the policy holds: every replica derives the same ones, and
a client can neither guess another scope's salt nor send one of its own (the gateway's replaces it).
A team's seed and salt change when its members do, as a rotated key's do: its prefixes are then
prefilled again, once.

The request path only reads the tables built here (dict lookups in ``request/cache_keys.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from gateway.policy import schema

FLEET_SHARE = "fleet"
KEY_SHARE = "key"
TEAM_SHARE = "team"


class CacheScope(NamedTuple):
    label: str  # "" for the fleet, "key:<name>" or "team:<name>": what client keys are scoped by
    seed: int  # the prefix keys' seed (0: the fleet's)
    salt: str | None  # the engines' cache_salt (None: the fleet's, no salt)


FLEET = CacheScope("", 0, None)


@dataclass(frozen=True, slots=True)
class CacheScopes:
    """The compiled tables: each route's share (its setting, or the default resolved), each key's own
    setting where it has one, and each key's two scopes (its own, its team's)."""

    route_share: Mapping[str, str] = field(default_factory=dict)
    key_share: Mapping[str, str] = field(default_factory=dict)
    by_key: Mapping[str, tuple[CacheScope, CacheScope]] = field(default_factory=dict)

    def scope(self, route: str, key_name: str | None) -> CacheScope:
        """The scope of a request on ``route`` by the key named ``key_name`` (None: no key, the fleet's).
        The request path inlines this (``request/cache_keys.py``); /admin/explain calls it."""
        if key_name is None or key_name not in self.by_key:
            return FLEET
        share = self.key_share.get(key_name) or self.route_share.get(route, FLEET_SHARE)
        if share == FLEET_SHARE:
            return FLEET
        own, team = self.by_key[key_name]
        return team if share == TEAM_SHARE else own


def _derived(label: str, digests: list[str]) -> CacheScope:
    secret = bytes.fromhex("".join(sorted(digests)))
    seed = hmac.new(secret, b"prefix-keys\0" + label.encode(), hashlib.sha256).digest()
    salt = hmac.new(secret, b"cache-salt\0" + label.encode(), hashlib.sha256).digest()
    # 43 characters of URL-safe base64 (256 bits): within vLLM's 128 and free of '@', '/', '\\'.
    return CacheScope(
        label, int.from_bytes(seed[:8], "big"), base64.urlsafe_b64encode(salt).decode().rstrip("=")
    )


def compile_cache_scopes(raw: schema.PolicyFile) -> CacheScopes:
    keys = raw.auth.keys
    route_share: dict[str, str] = {}
    for name, route in raw.routes.items():
        if route.prefix_cache is not None:
            route_share[name] = route.prefix_cache.share
        else:  # isolated by default once a second key may send to it
            users = sum(1 for entry in keys if "*" in entry.routes or name in entry.routes)
            route_share[name] = KEY_SHARE if users > 1 else FLEET_SHARE
    teams: dict[str, list[str]] = {}
    for entry in keys:
        if entry.team is not None:
            teams.setdefault(entry.team, []).append(entry.sha256)
    team_scopes = {team: _derived(f"team:{team}", digests) for team, digests in teams.items()}
    by_key: dict[str, tuple[CacheScope, CacheScope]] = {}
    for entry in keys:
        own = _derived(f"key:{entry.name}", [entry.sha256])
        # A key of no team shares as a team of one: itself.
        by_key[entry.name] = (own, own if entry.team is None else team_scopes[entry.team])
    return CacheScopes(
        route_share=types.MappingProxyType(route_share),
        key_share=types.MappingProxyType(
            {entry.name: entry.prefix_cache.share for entry in keys if entry.prefix_cache is not None}
        ),
        by_key=types.MappingProxyType(by_key),
    )
