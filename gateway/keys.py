"""``gateway keys``: create a client key (printed once, with the policy's whole ``auth:`` block) and
list a policy's keys (names, routes, admin, limits, budgets; digests only by their first characters)."""

from __future__ import annotations

import sys

from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import PolicyError, load_policy
from gateway.policy.schema import Budgets, RateLimit
from gateway.values.auth import ALL_ROUTES, ApiKey, new_key, policy_line

DIGEST_SHOWN = 8  # enough to tell keys apart, too little to be the digest


def create_key(name: str, routes: list[str], admin: bool) -> str:
    """What `gateway keys create` prints: the key, then a YAML block that pastes into any policy."""
    key = new_key()
    entry = policy_line(name, key, routes=routes, admin=admin)
    return (
        f"API key for {name} (shown once; the policy stores only its SHA-256):\n\n  {key}\n\n"
        "Paste this block at the top level of the policy (a policy with no `auth:` section yet):\n\n"
        f"auth:\n  keys:\n    {entry}\n\n"
        "If the policy has `auth: keys:` already, add only the last line to that list.\n"
        "Then check it: gateway check POLICY (a running gateway reloads the file by itself).\n"
    )


def list_keys(policy_path: str) -> int:
    try:
        policy = load_policy(policy_path)
    except PolicyError as exc:
        print(f"gateway keys list: the policy does not load:\n{exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render_keys(policy))
    return 0


def render_keys(policy: CompiledPolicy) -> str:
    keys = sorted(policy.api_keys.values(), key=lambda k: k.name)
    if not keys:
        return (
            f"{policy.source}: no API keys; the gateway serves without keys, on loopback only.\n"
            "Add one: gateway keys create NAME\n"
        )
    headers = ["name", "routes", "admin", "rate limit", "budgets", "sha256"]
    rows = [_row(policy, key) for key in keys]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = [f"{policy.source}: {len(keys)} API key{'s' if len(keys) != 1 else ''}"]
    for cells in [headers, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    return "\n".join(lines) + "\n"


def _row(policy: CompiledPolicy, key: ApiKey) -> list[str]:
    routes = ", ".join(sorted(key.routes)) if ALL_ROUTES not in key.routes else "all"
    return [
        key.name,
        routes,
        "yes" if key.admin else "no",
        _rate_limit(policy.rate_limits.get(key.name)),
        _budgets(policy.key_budgets.get(key.name)),
        key.digest[:DIGEST_SHOWN] + "…",
    ]


def _rate_limit(limit: RateLimit | None) -> str:
    if limit is None:
        return "-"
    parts = []
    if limit.requests_per_minute is not None:
        parts.append(f"{limit.requests_per_minute} req/min")
    if limit.tokens_per_minute is not None:
        parts.append(f"{limit.tokens_per_minute} tok/min")
    return ", ".join(parts) or "-"


def _budgets(budgets: Budgets | None) -> str:
    if budgets is None:
        return "-"
    parts = []
    if budgets.per_day_usd is not None:
        parts.append(f"${budgets.per_day_usd:g}/day")
    if budgets.per_month_usd is not None:
        parts.append(f"${budgets.per_month_usd:g}/month")
    return ", ".join(parts) + f" ({budgets.on_exhausted})"
