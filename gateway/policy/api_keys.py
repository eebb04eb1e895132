"""The policy's API keys: those in ``auth.keys`` and in the ``auth.keys_file`` beside it (read with the
policy, and part of its digest, so rotating a key is a reload), checked (routes that exist, no name or
digest twice) and compiled into the lookup by digest that ``values/auth.py`` authenticates against.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pydantic import ValidationError

from gateway.policy import schema
from gateway.policy.document import Document, PolicyError, PolicyFileUnreadable, Problem, decode, parse
from gateway.values.auth import ApiKey


def keys_file_path(keys_file: str | None, source: str) -> str | None:
    """Where ``auth.keys_file`` points: as written if absolute, else beside the policy file."""
    return None if keys_file is None else str(Path(source).parent / keys_file)


def read_keys_file(path: str | None) -> bytes | None:
    """The keys file's bytes; None when the policy names none or it does not exist (no keys from it)."""
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        message = f"cannot read auth.keys_file: {exc.strerror or exc}"
        raise PolicyFileUnreadable([Problem(path, 0, 0, "", message)]) from None


def with_keys_digest(policy_digest: str, keys_path: str | None, keys: bytes | None) -> str:
    """The policy's digest, changed by its keys file's content, so a key rotation is a reload."""
    if keys_path is None:
        return policy_digest
    keys_digest = hashlib.sha256(keys or b"").hexdigest() if keys is not None else "absent"
    return hashlib.sha256(f"{policy_digest}:{keys_digest}".encode()).hexdigest()


def keys_from_file(path: str | None, data: bytes | None) -> list[schema.ApiKeyEntry]:
    if path is None or data is None:
        return []
    doc = parse(decode(data, path), path)
    try:
        return schema.KeysFile.model_validate(doc.plain).keys
    except ValidationError as exc:
        raise PolicyError(doc.schema_problems(exc)) from None


def compile_keys(auth: schema.Auth) -> dict[str, ApiKey]:
    return {
        entry.sha256: ApiKey(
            name=entry.name, digest=entry.sha256, routes=frozenset(entry.routes), admin=entry.admin
        )
        for entry in auth.keys
    }


def key_problems(raw: schema.PolicyFile, doc: Document) -> list[Problem]:
    """Keys must name routes that exist, and neither a name nor a digest may appear twice."""
    problems: list[Problem] = []
    names: set[str] = set()
    digests: set[str] = set()
    for i, entry in enumerate(raw.auth.keys):
        for j, route in enumerate(entry.routes):
            if route != "*" and route not in raw.routes:
                known = ", ".join(raw.routes)
                problems.append(
                    doc.problem(("auth", "keys", i, "routes", j), f"no route '{route}' (routes: {known})")
                )
        if entry.name in names:
            problems.append(
                doc.problem(("auth", "keys", i, "name"), f"key name '{entry.name}' is used twice")
            )
        if entry.sha256 in digests:
            problems.append(doc.problem(("auth", "keys", i, "sha256"), "the same key digest appears twice"))
        names.add(entry.name)
        digests.add(entry.sha256)
    return problems
