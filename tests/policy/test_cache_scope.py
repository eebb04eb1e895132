"""Who shares the prefix cache (``prefix_cache: {share: ...}`` on routes and keys): the defaults, a
key over its route, teams, and the salts and seeds each scope gets."""

from __future__ import annotations

from gateway.policy.cache_scope import FLEET
from gateway.policy.compiled import CompiledPolicy
from gateway.policy.load import compile_policy_text
from gateway.values.auth import digest_of

POLICY = """\
backends:
  pool:
    dialect: vllm
    url: http://127.0.0.1:9/v1
    model: m
    pricing:
      gpu_hours: {usd_per_hour: 1}
routes:
  many: {backends: [pool]}
  alone: {backends: [pool]}
  common: {backends: [pool], prefix_cache: {share: fleet}}
  teams: {backends: [pool], prefix_cache: {share: team}}
auth:
  keys:
"""


def compiled(keys: str) -> CompiledPolicy:
    return compile_policy_text(POLICY + keys, "p.yaml", environ={})


def key(name: str, extra: str = "", routes: str = "[many, common, teams]") -> str:
    return f"    - {{name: {name}, sha256: {digest_of('gwk-' + name)}, routes: {routes}{extra}}}\n"


def test_a_route_more_than_one_key_uses_is_per_key_unless_it_opts_into_sharing() -> None:
    policy = compiled(key("alice") + key("bob") + key("carol", routes="[alone]"))
    scopes = policy.cache_scopes
    alice, bob = scopes.scope("many", "alice"), scopes.scope("many", "bob")
    assert alice.label == "key:alice" and bob.label == "key:bob"
    assert alice.salt != bob.salt and alice.seed != bob.seed
    assert scopes.scope("alone", "carol") == FLEET  # one key alone on its route: nobody to hide from
    assert scopes.scope("common", "alice") == scopes.scope("common", "bob") == FLEET
    assert scopes.scope("many", None) == FLEET


def test_a_keys_own_setting_wins_over_its_routes() -> None:
    policy = compiled(
        key("alice", ", prefix_cache: {share: fleet}")
        + key("bob")
        + key("ci", ", prefix_cache: {share: key}")
    )
    scopes = policy.cache_scopes
    assert scopes.scope("many", "alice") == FLEET
    assert scopes.scope("many", "bob").label == "key:bob"
    assert scopes.scope("common", "ci").label == "key:ci"


def test_keys_of_one_team_share_and_a_key_of_none_is_a_team_of_one() -> None:
    policy = compiled(key("alice", ", team: research") + key("bob", ", team: research") + key("eve"))
    scopes = policy.cache_scopes
    alice, bob, eve = (scopes.scope("teams", name) for name in ("alice", "bob", "eve"))
    assert alice == bob and alice.label == "team:research"
    assert eve.label == "key:eve"
    assert scopes.scope("many", "alice").label == "key:alice"  # the route's default: per key


def test_salts_are_what_vllm_accepts_and_the_same_on_every_load() -> None:
    """Every replica derives the same salt and seed from the same policy; vLLM takes at most 128
    characters and none of '@', '/', '\\\\' (docs/contracts/vllm.yaml, prefix_cache.salt)."""
    keys = key("alice") + key("bob")
    salt = compiled(keys).cache_scopes.scope("many", "alice").salt
    assert salt is not None and 32 <= len(salt) <= 128 and not set(salt) & set("@/\\\0")
    assert compiled(keys).cache_scopes.scope("many", "alice") == compiled(keys).cache_scopes.scope(
        "many", "alice"
    )
    # Another key's digest under the same name: another salt (the digest is the secret).
    renamed = compiled(f"    - {{name: alice, sha256: {digest_of('gwk-other')}}}\n" + key("bob"))
    assert renamed.cache_scopes.scope("many", "alice").salt != salt
