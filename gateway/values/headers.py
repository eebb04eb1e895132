"""Named headers read from an ASGI request's raw list (names are lower case there) in one pass.

Why not Starlette's ``Headers``: a lookup by name there raises and catches a KeyError for each header
the request lacks, and most requests lack most of the headers the gateway looks for (~1 us each on the
request path)."""

from __future__ import annotations

from collections.abc import Iterable


def first_values(raw: Iterable[tuple[bytes, bytes]], names: tuple[bytes, ...]) -> list[str | None]:
    """The first value of each of ``names`` (lower case), in their order; None for one not sent."""
    found: list[str | None] = [None] * len(names)
    for name, value in raw:
        if name in names:
            index = names.index(name)
            if found[index] is None:
                found[index] = value.decode("latin-1")
    return found
