"""Backends: one client per kind of upstream, chosen by the policy's ``dialect``.

The request path asks ``Backends.client_for(backend)`` and sees only the seam in ``base.py``. A new
kind (a provider reached through a translating SDK) is a new entry in ``CLIENT_KINDS``: the request
path does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from gateway.backends.base import BackendClient, Fetched, Upstream, UpstreamCall
from gateway.backends.openai_compat import OpenAICompatClient
from gateway.policy.compiled import CompiledBackend

__all__ = ["CLIENT_KINDS", "BackendClient", "Backends", "Fetched", "Upstream", "UpstreamCall"]


def _litellm_client() -> BackendClient:
    from gateway.backends.via_litellm import LitellmClient  # litellm is imported only when a policy uses it

    return LitellmClient()


# Which client speaks to a backend of each dialect. The OpenAI-compatible dialects share one client
# (one connection pool); they differ only in what the relay and the signal scraper read.
CLIENT_KINDS: Mapping[str, str] = MappingProxyType(
    {
        "vllm": "openai_compat",
        "llamacpp": "openai_compat",
        "openai": "openai_compat",
        "sglang": "openai_compat",
        "litellm": "litellm",
    }
)
CLIENT_FACTORIES: Mapping[str, Callable[[], BackendClient]] = MappingProxyType(
    {"openai_compat": OpenAICompatClient, "litellm": _litellm_client}
)


class Backends:
    """The process's backend clients, each built on first use and closed once at shutdown."""

    def __init__(self) -> None:
        self._clients: dict[str, BackendClient] = {}

    def client_for(self, backend: CompiledBackend) -> BackendClient:
        return self._client(CLIENT_KINDS[backend.dialect])

    async def fetch(
        self,
        url: str,
        headers: dict[str, str] | None,
        timeout_s: float,
        backend: CompiledBackend | None = None,
    ) -> Fetched:
        """A plain GET (load signals, health) through the same HTTP stack as completions."""
        return await self._client("openai_compat").fetch(url, headers, timeout_s, backend)

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    def _client(self, kind: str) -> BackendClient:
        client = self._clients.get(kind)
        if client is None:
            client = self._clients[kind] = CLIENT_FACTORIES[kind]()
        return client
