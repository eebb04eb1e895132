"""Route aliases: the other model ids a route answers to (a client's own default id, say), checked at
load and compiled into the lookups ``CompiledPolicy.route_for`` reads.

An alias is an exact id or a glob (``*``, ``?``, ``[...]``). No alias may be claimed twice or shadow a
route's own name; where two routes' globs could both match an id, the longer (more specific) one wins.
"""

from __future__ import annotations

from gateway.policy import schema
from gateway.policy.document import Document, Problem

GLOB_CHARS = frozenset("*?[")


def is_glob(alias: str) -> bool:
    return not GLOB_CHARS.isdisjoint(alias)


def alias_problems(raw: schema.PolicyFile, doc: Document) -> list[Problem]:
    """An alias two routes claim (or one route twice), and an alias that is another route's name."""
    problems: list[Problem] = []
    claimed: dict[str, str] = {}
    for route_name, route in raw.routes.items():
        for i, alias in enumerate(route.aliases):
            loc = ("routes", route_name, "aliases", i)
            owner = claimed.get(alias)
            if owner is not None:
                where = "this route" if owner == route_name else f"route '{owner}'"
                problems.append(doc.problem(loc, f"alias '{alias}' is already claimed by {where}"))
            elif alias in raw.routes:
                problems.append(doc.problem(loc, f"alias '{alias}' is the name of route '{alias}'"))
            claimed.setdefault(alias, route_name)
    return problems


def compiled_aliases(raw: schema.PolicyFile) -> tuple[dict[str, str], tuple[tuple[str, str], ...]]:
    """Exact aliases by id, and globs longest first (stable: a tie keeps the declaration order)."""
    exact: dict[str, str] = {}
    globs: list[tuple[str, str]] = []
    for route_name, route in raw.routes.items():
        for alias in route.aliases:
            if is_glob(alias):
                globs.append((alias, route_name))
            else:
                exact.setdefault(alias, route_name)
    globs.sort(key=lambda pair: -len(pair[0].replace("*", "")))
    return exact, tuple(globs)
